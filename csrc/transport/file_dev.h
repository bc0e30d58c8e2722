/*
 * What the file transport's two engines (io_uring and psync) share: the
 * device and its descriptors.
 */
#ifndef FX100IO_FILE_DEV_H
#define FX100IO_FILE_DEV_H

#include "../internal.h"
#include "../reqs.h"

struct file_dev {
	struct fx_dev base;
	int fd_direct;        /* O_DIRECT descriptor, -1 when direct I/O is off */
	int fd_buffered;      /* page-cache descriptor for unaligned parts */
	uint16_t load_ioprio; /* sqe->ioprio of a load read, 0: none (FX_CAP_IOPRIO) */
};

int fx_file_dev_open(const struct fx_transport_ops *ops, const char *path,
		     const struct fx_dev_opts *o, struct fx_dev **out);
void fx_file_dev_close(struct fx_dev *dev);

#endif
