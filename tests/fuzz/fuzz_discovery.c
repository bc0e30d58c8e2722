/*
 * The discovery log reader (fx_nvmf_disc_log_read, csrc/host/discovery.c) against
 * a controller that sends arbitrary log pages and changes them under us.
 *
 * Input: u8 script[8]; the log page (what is past the input reads as
 * zeros).  script[k % 8] says what the controller does on the k-th Get
 * Log Page: low 2 bits 0 serve, 1 fail (-EIO, a status), 2 change the first
 * entry (bit 7) or not, bump GENCTR, serve; 3 set NUMREC to bits 2-6, bump
 * GENCTR unless bit 7 is set (a controller that breaks the spec), serve.
 *
 * Checked: every read the reader asks for is dword-sized, inside the
 * log's largest size and lands in a buffer of that size (ASan); success
 * returns exactly the controller's current NUMREC entries, byte for byte
 * as the log holds them now (a log that changed while being read must not
 * be returned, unless the controller hid the change from GENCTR); -EPROTO
 * only for a header we refuse; -EAGAIN only after the log moved on every
 * try; failures leave nothing allocated (LSan).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/ctrl.h"

#define FAIL(...)                                                \
	do {                                                     \
		fprintf(stderr, "fuzz_discovery: " __VA_ARGS__); \
		fprintf(stderr, "\n");                           \
		abort();                                         \
	} while (0)

#define SCRIPT 8
#define HDR 1024
#define ENTRY 1024
#define MAX_RECORDS 4096 /* what the reader accepts; more is -EPROTO */
#define LOG_MAX (HDR + (size_t)MAX_RECORDS * ENTRY)

struct ctrl {
	const uint8_t *script;
	uint8_t *log;   /* the log as the controller holds it now */
	size_t log_len; /* bytes of the log that are not zero */
	unsigned calls, fails, hdr_reads;
	int changed;
	int lied; /* changed the log without bumping GENCTR */
};

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static int get_log(void *arg, uint64_t off, void *buf, uint32_t len, uint16_t *status)
{
	struct ctrl *c = arg;
	uint8_t op = c->script[c->calls % SCRIPT];

	c->calls++;
	if (c->calls > 3 * 8 + 1)
		FAIL("more than %u Get Log Page commands", c->calls - 1);
	if (len == 0 || len % 4 || off % 4 || off > LOG_MAX || len > LOG_MAX - off)
		FAIL("Get Log Page off %llu len %u", (unsigned long long)off, len);
	switch (op & 3) {
	case 1:
		c->fails++;
		if (status)
			*status = 0x4002; /* DNR, invalid field */
		return -EIO;
	case 2:
		if (op & 0x80)
			c->log[HDR + 3] ^= 0x5a;
		put64(c->log, le64(c->log) + 1);
		c->changed = 1;
		break;
	case 3:
		put64(c->log + 8, (op >> 2) & 0x1f);
		if (op & 0x80)
			c->lied = 1;
		else
			put64(c->log, le64(c->log) + 1);
		c->changed = 1;
		break;
	}
	if (off == 0)
		c->hdr_reads++;
	/* the reader's buffer must hold len bytes: ASan checks the memset */
	memset(buf, 0, len);
	if (off < c->log_len)
		memcpy(buf, c->log + off, len < c->log_len - off ? len : c->log_len - off);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ctrl c;
	struct nvmf_disc_log_entry *e = (void *)1;
	uint32_t n = 12345;
	uint16_t status = 0;
	const char *why = NULL;
	uint64_t numrec;
	int r;

	if (size < SCRIPT)
		return 0;
	memset(&c, 0, sizeof(c));
	c.script = data;
	/* room for the header and the first entry, which the script edits */
	c.log_len = size - SCRIPT > HDR + ENTRY ? size - SCRIPT : HDR + ENTRY;
	c.log = calloc(1, c.log_len);
	if (!c.log)
		abort();
	memcpy(c.log, data + SCRIPT, size - SCRIPT);

	r = fx_nvmf_disc_log_read(get_log, &c, &e, &n, &status, &why);
	numrec = le64(c.log + 8);
	if (r == 0) {
		if (n != numrec && !c.lied)
			FAIL("%u entries returned, the log has %llu", n,
			     (unsigned long long)numrec);
		if ((n == 0) != (e == NULL))
			FAIL("%u entries at %p", n, (void *)e);
		for (uint32_t i = 0; i < n; i++) {
			uint8_t want[ENTRY];
			size_t at = HDR + (size_t)i * ENTRY;

			memset(want, 0, sizeof(want));
			if (at < c.log_len)
				memcpy(want, c.log + at,
				       c.log_len - at < ENTRY ? c.log_len - at : ENTRY);
			if (!c.lied && memcmp(&e[i], want, ENTRY))
				FAIL("entry %u is not what the log holds now", i);
		}
		if (why)
			FAIL("success with a reason to refuse: %s", why);
		free(e);
	} else {
		if (e != NULL || n != 0)
			FAIL("error %d with %u entries at %p", r, n, (void *)e);
		if (r == -EPROTO) {
			uint16_t recfmt = (uint16_t)(c.log[16] | c.log[17] << 8);

			if (!why || (recfmt == 0 && numrec <= MAX_RECORDS))
				FAIL("-EPROTO for recfmt %u, %llu records", recfmt,
				     (unsigned long long)numrec);
		} else if (r == -EIO) {
			if (!c.fails || status != 0x4002)
				FAIL("-EIO without a failed read");
		} else if (r == -EAGAIN) {
			if (!c.changed || c.hdr_reads < 2)
				FAIL("-EAGAIN but the log never changed");
		} else {
			FAIL("unexpected error %d", r);
		}
	}
	free(c.log);
	return 0;
}
