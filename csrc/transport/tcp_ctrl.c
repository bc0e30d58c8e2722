/*
 * NVMe-oF control path over TCP on blocking sockets (see tcp_ctrl.h):
 * the TCP transport table the generic controller code (host/) drives.
 *
 * One command at a time per connection: the caller (or the controller's
 * mutex) serialises, so a connection never has more than one command or one
 * R2T outstanding and the PDU stream can be parsed strictly in order.  Every
 * length that comes off the wire passes fx_tcp_pdu_check() and the
 * command's own bounds before it sizes a read, and data lands directly in
 * the caller's buffer (one copy, socket -> buffer).
 *
 * Sockets stay in blocking mode for their later users (transport/tcp.c);
 * here every send/recv is MSG_DONTWAIT behind poll() so each step honours a
 * deadline.  After a stream error (-EPROTO, -ETIMEDOUT, -ECONNRESET) the
 * socket is shut down, so later calls fail at once instead of parsing a
 * stream that is out of step.
 */
#ifndef _GNU_SOURCE /* tests/c/Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "transport/tcp_ctrl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "fx100io.h"
#include "host/auth_host.h"
#include "nvme_tcp/pdu.h"
#include "nvme_tcp/sock.h"
#include "nvme_tcp/ktls.h"
#include "nvme_tcp/tls.h"
#include "nvme_tcp/xfer.h"

/* NVMe/TCP: the admin queue takes up to 8 KiB of in-capsule data. */
#define ADMIN_INCAPSULE_MAX 8192
#define CONNECT_DATA_LEN 1024
/* A received header (plus header digest), typed views over the bytes. */
union rx_hdr {
	struct nvme_tcp_hdr ch;
	struct nvme_tcp_icresp_pdu icresp;
	struct nvme_tcp_term_pdu term;
	struct nvme_tcp_data_pdu data;
	struct nvme_tcp_r2t_pdu r2t;
	struct nvme_tcp_rsp_pdu rsp;
	uint8_t raw[FX_TCP_HEAD_MAX];
};

/* --------------------------------------------------------- socket I/O */

static void tls_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A secure channel that could not be set up: the reason for the caller
 * (fx_nvmf_auth_error) and the log. */
static void tls_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fx_nvmf_auth_error_vset(fmt, ap);
	va_end(ap);
	fx_nvmf_log("%s", fx_nvmf_auth_error());
}

/* nvme_tcp/sock.c's I/O with this thread's cancel fd: a cancelled call
 * stops waiting at once (-ECANCELED).  On a secure channel the same bytes
 * go through TLS records (nvme_tcp/tls.c); a record the peer broke (a bad
 * tag, an alert, a malformed record) is a protocol error like a malformed
 * PDU, and its reason is logged. */
static int tls_err(struct fx_tcp_conn *c, int r)
{
	if (r == -EBADMSG || r == -EPROTO || (r == -ECONNRESET && fx_tls_why(c->tls)[0])) {
		fx_nvmf_log("qid %u: TLS: %s", c->qid, fx_tls_why(c->tls));
		return r == -ECONNRESET ? r : -EPROTO;
	}
	return r;
}

static int send_iov(struct fx_tcp_conn *c, struct iovec *iov, int cnt, int64_t deadline)
{
	int r = c->tls ? tls_err(c, fx_tls_sendv(c->tls, c->fd, iov, cnt, deadline,
						 fx_nvmf_cancel_fd()))
		       : fx_tcp_sendv(c->fd, iov, cnt, MSG_DONTWAIT, deadline, fx_nvmf_cancel_fd(),
				      NULL);

	if (c->ktls && (r == -EBADMSG || r == -EMSGSIZE)) {
		/* the receive side's fault (the kernel aborted the socket on a
		 * bad record): mapped and logged as recv_full does */
		r = fx_ktls_send_error(c->ktls, r);
		fx_nvmf_log("qid %u: kTLS: %s", c->qid, fx_ktls_send_why(c->ktls));
		return r == -EBADMSG ? -EPROTO : r;
	}
	return r == -EPIPE ? -ECONNRESET : r;
}

static int recv_full(struct fx_tcp_conn *c, void *buf, size_t len, int64_t deadline)
{
	if (c->ktls) {
		/* the kernel opens the records; the ones it hands us are the
		 * same faults as in our layer, logged the same way */
		int r = fx_ktls_recv_full(c->ktls, c->fd, buf, len, deadline, fx_nvmf_cancel_fd());

		if (r && fx_ktls_why(c->ktls)[0] &&
		    (r == -EBADMSG || r == -EPROTO || r == -ECONNRESET))
			fx_nvmf_log("qid %u: kTLS: %s", c->qid, fx_ktls_send_why(c->ktls));
		return r == -EBADMSG ? -EPROTO : r;
	}
	if (c->tls)
		return tls_err(c, fx_tls_recv_full(c->tls, c->fd, buf, len, deadline,
						   fx_nvmf_cancel_fd()));
	return fx_tcp_recv_full(c->fd, buf, len, deadline, fx_nvmf_cancel_fd());
}

static int recv_discard(struct fx_tcp_conn *c, size_t len, int64_t deadline)
{
	uint8_t sink[4096];

	if (!c->tls && !c->ktls)
		return fx_tcp_recv_discard(c->fd, len, deadline, fx_nvmf_cancel_fd());
	while (len) {
		size_t n = len < sizeof(sink) ? len : sizeof(sink);
		int r = recv_full(c, sink, n, deadline);

		if (r)
			return r;
		len -= n;
	}
	return 0;
}

/* Stream errors leave the PDU stream out of step: make the socket unusable
 * (but keep the fd, which its owner closes) so the next call fails fast. */
static int conn_fail(struct fx_tcp_conn *c, int err)
{
	if (c->fd >= 0 && (err == -EPROTO || err == -ETIMEDOUT || err == -ECONNRESET ||
			   err == -EPIPE || err == -ECANCELED))
		shutdown(c->fd, SHUT_RDWR);
	return err;
}

/* Tell the controller why we drop the connection (best effort), then fail
 * with -EPROTO.  hdr/hlen: the offending header, sent back as the spec asks
 * (at most 152 bytes). */
static int proto_fail(struct fx_tcp_conn *c, uint16_t fes, uint32_t fei, const void *hdr,
		      unsigned hlen)
{
	uint8_t b[FX_TCP_TERM_MAX];
	struct iovec iov = {b, fx_tcp_term_build(b, NVME_TCP_H2C_TERM, fes, fei, hdr, hlen)};

	if (c->fd >= 0)
		(void)send_iov(c, &iov, 1, fx_nvmf_now_ms() + 100);
	return conn_fail(c, -EPROTO);
}

static const char *fes_str(uint16_t fes)
{
	switch (fes) {
	case NVME_TCP_FES_INVALID_PDU_HDR:
		return "invalid PDU header field";
	case NVME_TCP_FES_PDU_SEQ_ERR:
		return "PDU sequence error";
	case NVME_TCP_FES_HDR_DIGEST_ERR:
		return "header digest error";
	case NVME_TCP_FES_DATA_OUT_OF_RANGE:
		return "data transfer out of range";
	case NVME_TCP_FES_DATA_LIMIT_EXCEEDED:
		return "R2T/data transfer limit exceeded";
	case NVME_TCP_FES_UNSUPPORTED_PARAM:
		return "unsupported parameter";
	default:
		return "unknown fatal error";
	}
}

/*
 * Receive and check the next PDU header (and header digest) into *h.
 * A C2HTermReq is consumed here: the controller found a fatal error in what
 * we sent (FES 1..6 -> -EPROTO) or gave some other reason (-ECONNRESET); it
 * closes the connection either way.
 */
static int recv_hdr(struct fx_tcp_conn *c, union rx_hdr *h, uint32_t max_plen, int64_t deadline)
{
	int r = recv_full(c, &h->ch, sizeof(h->ch), deadline);

	if (r)
		return conn_fail(c, r);
	int n = fx_tcp_pdu_check(&h->ch, 1, c->hdgst, c->ddgst, max_plen);

	if (n < 0) {
		fx_nvmf_log("qid %u: malformed PDU header (type 0x%02x flags 0x%02x hlen %u pdo %u "
			    "plen %u)",
			    c->qid, h->ch.type, h->ch.flags, h->ch.hlen, h->ch.pdo, h->ch.plen);
		return proto_fail(c, NVME_TCP_FES_INVALID_PDU_HDR, 0, &h->ch, sizeof(h->ch));
	}
	if ((unsigned)n > sizeof(*h))
		return proto_fail(c, NVME_TCP_FES_INVALID_PDU_HDR, 0, &h->ch, sizeof(h->ch));
	r = recv_full(c, h->raw + sizeof(h->ch), (size_t)n - sizeof(h->ch), deadline);
	if (r)
		return conn_fail(c, r);

	if (h->ch.type == NVME_TCP_C2H_TERM) {
		uint16_t fes = h->term.fes;
		uint32_t fei = h->term.feil | (uint32_t)h->term.feiu << 16;

		(void)recv_discard(c, h->ch.plen - (uint32_t)n, fx_nvmf_now_ms() + 100);
		fx_nvmf_log("qid %u: controller terminated the connection: FES 0x%x (%s), FEI 0x%x",
			    c->qid, fes, fes_str(fes), fei);
		shutdown(c->fd, SHUT_RDWR);
		return (fes >= NVME_TCP_FES_INVALID_PDU_HDR &&
			fes <= NVME_TCP_FES_UNSUPPORTED_PARAM)
			       ? -EPROTO
			       : -ECONNRESET;
	}

	if (fx_tcp_hdgst_check(h->raw, (unsigned)n) < 0) {
		fx_nvmf_log("qid %u: header digest mismatch on PDU type 0x%02x", c->qid,
			    h->ch.type);
		return proto_fail(c, NVME_TCP_FES_HDR_DIGEST_ERR, 0, h->raw, h->ch.hlen);
	}
	return n;
}

/* ------------------------------------------------------------ commands */

/* Send CapsuleCmd with incap bytes of data (0 or len) in the capsule. */
static int send_capsule(struct fx_tcp_conn *c, const struct nvme_sqe *sqe, const void *data,
			uint32_t incap, int64_t deadline)
{
	uint8_t b[FX_TCP_HEAD_MAX];
	struct nvme_tcp_cmd_pdu *pdu = (struct nvme_tcp_cmd_pdu *)b;
	struct iovec iov[3];
	uint32_t dd;

	fx_tcp_hdr_init(&pdu->hdr, NVME_TCP_CMD, incap, c->hdgst, c->ddgst, c->cpda);
	pdu->sqe = *sqe;
	int head = fx_tcp_head_finish(b, sizeof(b));

	if (head < 0)
		return head;
	return send_iov(c, iov, fx_tcp_pdu_iov(iov, b, (unsigned)head, data, incap, &dd), deadline);
}

/* Answer an R2T: H2CData PDUs of at most maxh2cdata covering
 * [r2to, r2to + r2tl) of data, the last one flagged LAST_PDU. */
static int send_h2c(struct fx_tcp_conn *c, uint16_t cid, uint16_t ttag, const uint8_t *data,
		    uint32_t r2to, uint32_t r2tl, int64_t deadline)
{
	uint32_t off = r2to, end = r2to + r2tl;
	uint32_t maxd = c->maxh2cdata ? c->maxh2cdata : end - r2to;

	while (off < end) {
		uint32_t n = end - off < maxd ? end - off : maxd;
		uint8_t b[FX_TCP_HEAD_MAX];
		struct nvme_tcp_data_pdu *p = (struct nvme_tcp_data_pdu *)b;
		struct iovec iov[3];
		uint32_t dd;

		fx_tcp_hdr_init(&p->hdr, NVME_TCP_H2C_DATA, n, c->hdgst, c->ddgst, c->cpda);
		p->cccid = cid;
		p->ttag = ttag;
		p->datao = off;
		p->datal = n;
		memset(p->rsvd, 0, sizeof(p->rsvd));
		if (off + n == end)
			p->hdr.flags |= NVME_TCP_F_DATA_LAST;
		int head = fx_tcp_head_finish(b, sizeof(b));

		if (head < 0)
			return conn_fail(c, head);
		int r = send_iov(c, iov, fx_tcp_pdu_iov(iov, b, (unsigned)head, data + off, n, &dd),
				 deadline);

		if (r)
			return conn_fail(c, r);
		off += n;
	}
	return 0;
}

/*
 * A read that completed successfully: 0 when all len bytes arrived.  Only a
 * command fx_tcp_xfer_cmd lets end early (an Authentication Receive) can get
 * here with fewer; its caller must learn how many, or it would parse a
 * message the controller cut short as whole (host/nvmf.h, exec).  The rest
 * of the buffer is zeroed here so no caller trusts what was there before.
 */
static int read_done(const struct fx_tcp_xfer *x, uint8_t *buf, uint32_t len)
{
	if (x->write || x->received >= len)
		return 0;
	memset(buf + x->received, 0, len - x->received);
	if (!x->received)
		return -ENODATA;
	return x->received > INT32_MAX ? INT32_MAX : (int)x->received;
}

/*
 * The whole exchange for one command.  incap_max: the most write data that
 * may travel in the capsule on this queue (larger writes wait for R2T).
 */
static int exec_cmd(struct fx_tcp_conn *c, struct nvme_sqe *sqe, void *data, uint32_t len,
		    int write, uint32_t incap_max, struct nvme_cqe *cqe, int cap_ms)
{
	uint8_t *buf = data;

	memset(cqe, 0, sizeof(*cqe));
	if (c->fd < 0)
		return -ENOTCONN;
	if (len && !data)
		return -EINVAL;

	/* cap_ms > 0 shortens the queue's own timeout (see the table in
	 * host/nvmf.h); it never lengthens it. */
	int timeout_ms = c->timeout_ms;

	if (cap_ms > 0 && (timeout_ms <= 0 || timeout_ms > cap_ms))
		timeout_ms = cap_ms;
	int64_t deadline = fx_nvmf_deadline_in(timeout_ms);
	uint16_t cid = c->next_cid++;
	uint32_t incap = (write && len && len <= incap_max) ? len : 0;

	sqe->cid = cid;
	/* PSDT 01b: fabrics commands describe data with SGLs; keep FUSE. */
	sqe->flags = (uint8_t)((sqe->flags & 0x3f) | NVME_CMD_SGL_METABUF);
	memset(&sqe->dptr, 0, sizeof(sqe->dptr));
	sqe->dptr.length = len;
	/* In-capsule data sits at offset 0 of the capsule's data area
	 * (ICDOFF 0 is all NVMe/TCP targets report); everything else, even
	 * "no data", is a transport SGL the PDUs fill in. */
	sqe->dptr.type = incap ? NVME_SGL_DATA_BLOCK_OFFSET : NVME_SGL_TRANSPORT_DATA_BLOCK;

	int r = send_capsule(c, sqe, data, incap, deadline);

	if (r)
		return conn_fail(c, r);

	/* Largest PDU this command can legally bring: a data PDU with all
	 * of len, header, digests and the widest padding pdo allows. */
	uint32_t max_plen = len > UINT32_MAX - 512 ? UINT32_MAX : len + 512;
	struct fx_tcp_xfer x;
	int ddgst_bad = 0;
	union rx_hdr h;

	fx_tcp_xfer_init(&x, len, write, incap != 0);
	fx_tcp_xfer_cmd(&x, sqe);
	for (;;) {
		int n = recv_hdr(c, &h, max_plen, deadline);

		if (n < 0)
			return n;

		switch (h.ch.type) {
		case NVME_TCP_C2H_DATA: {
			uint32_t dd = (h.ch.flags & NVME_TCP_F_DDGST) ? NVME_TCP_DIGEST_LEN : 0;
			uint32_t payload = h.ch.plen - h.ch.pdo - dd;

			if (h.data.cccid != cid) {
				fx_nvmf_log("qid %u: C2HData for cid %u, waiting for %u", c->qid,
					    h.data.cccid, cid);
				return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw, h.ch.hlen);
			}
			/* In order and inside the buffer (nvme_tcp/xfer.c's rule), so
			 * success means every byte was written exactly once. */
			if (fx_tcp_xfer_c2h(&x, &h.data, dd != 0) < 0) {
				fx_nvmf_log(
					"qid %u: cid %u: %s (datao %u datal %u, payload %u, %u of %u "
					"bytes so far)",
					c->qid, cid, x.why, h.data.datao, h.data.datal, payload,
					x.received, len);
				return proto_fail(c, x.fes, x.fei, h.raw, h.ch.hlen);
			}
			uint32_t at = x.received;

			r = recv_discard(c, h.ch.pdo - (uint32_t)n, deadline);
			if (!r)
				r = recv_full(c, buf + at, payload, deadline);
			if (r)
				return conn_fail(c, r);
			if (dd) {
				uint32_t got;

				r = recv_full(c, &got, sizeof(got), deadline);
				if (r)
					return conn_fail(c, r);
				if (got != fx_tcp_ddgst(buf + at, payload)) {
					/* The stream is intact; only this data is bad.
					 * Finish the command, then fail it like Linux
					 * does (Data Transfer Error). */
					fx_nvmf_log("qid %u: data digest mismatch (cid %u datao %u "
						    "datal %u)",
						    c->qid, cid, at, payload);
					ddgst_bad = 1;
				}
			}
			if (fx_tcp_xfer_c2h_done(&x, &h.data)) {
				/* SUCCESS: no CapsuleResp follows. */
				cqe->cid = cid;
				cqe->sqid = c->qid;
				if (ddgst_bad) {
					cqe->status = NVME_SC_DATA_XFER_ERROR << 1;
					return -EIO;
				}
				return read_done(&x, buf, len);
			}
			break;
		}
		case NVME_TCP_R2T:
			if (h.r2t.cccid != cid || fx_tcp_xfer_r2t(&x, h.r2t.r2to, h.r2t.r2tl) < 0) {
				fx_nvmf_log(
					"qid %u: bad R2T (cccid %u cid %u r2to %u r2tl %u, %s of %u "
					"bytes%s): %s",
					c->qid, h.r2t.cccid, cid, h.r2t.r2to, h.r2t.r2tl,
					write ? "write" : "read", len,
					incap ? " sent in-capsule" : "",
					h.r2t.cccid != cid ? "unknown command" : x.why);
				if (h.r2t.cccid != cid)
					return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw,
							  h.ch.hlen);
				return proto_fail(c, x.fes, x.fei, h.raw, h.ch.hlen);
			}
			r = send_h2c(c, cid, h.r2t.ttag, buf, h.r2t.r2to, h.r2t.r2tl, deadline);
			if (r)
				return r;
			fx_tcp_xfer_r2t_sent(&x);
			break;
		case NVME_TCP_RSP:
			*cqe = h.rsp.cqe;
			if (cqe->cid != cid) {
				fx_nvmf_log("qid %u: CapsuleResp for cid %u, waiting for %u",
					    c->qid, cqe->cid, cid);
				return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw, h.ch.hlen);
			}
			/* Success must mean the whole transfer happened:
			 * otherwise the caller would trust stale bytes. */
			if (fx_tcp_xfer_rsp(&x, fx_nvmf_status_field(cqe)) < 0) {
				fx_nvmf_log("qid %u: cid %u: %s (%u of %u bytes)", c->qid, cid,
					    x.why, write ? x.sent : x.received, len);
				return conn_fail(c, -EPROTO);
			}
			if (fx_nvmf_status_field(cqe))
				return -EIO;
			if (ddgst_bad) {
				cqe->status = NVME_SC_DATA_XFER_ERROR << 1;
				return -EIO;
			}
			return read_done(&x, buf, len);
		default:
			fx_nvmf_log("qid %u: unexpected PDU type 0x%02x during a command", c->qid,
				    h.ch.type);
			return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw, h.ch.hlen);
		}
	}
}

int fx_tcp_exec(struct fx_tcp_conn *c, struct nvme_sqe *sqe, void *data, uint32_t len, int write,
		struct nvme_cqe *cqe)
{
	return exec_cmd(c, sqe, data, len, write, c->incap_max, cqe, 0);
}

/* ------------------------------------------------------- connection */

/* Numeric host first, as tests and URIs give it; a name is resolved only
 * when the string is not a literal. */
static int tcp_open(const struct fx_nvmf_addr *a, int64_t deadline, int *out)
{
	struct addrinfo hints = {
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
	};
	struct addrinfo *res = NULL;
	int rc = getaddrinfo(a->host, a->port, &hints, &res);

	if (rc == EAI_NONAME) {
		hints.ai_flags = AI_ADDRCONFIG;
		rc = getaddrinfo(a->host, a->port, &hints, &res);
	}
	if (rc) {
		if (rc == EAI_MEMORY)
			return -ENOMEM;
		if (rc == EAI_AGAIN)
			return -EAGAIN;
		if (rc == EAI_SYSTEM && errno)
			return -errno;
		return -EINVAL; /* not an address/port we can use */
	}

	int err = -EHOSTUNREACH;

	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
				ai->ai_protocol);

		if (fd < 0) {
			err = -errno;
			continue;
		}
		/* Non-blocking connect so the deadline holds. */
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
			if (errno != EINPROGRESS) {
				err = -errno;
				close(fd);
				continue;
			}
			int r = fx_tcp_wait(fd, POLLOUT, deadline, fx_nvmf_cancel_fd()), soerr = 0;
			socklen_t sl = sizeof(soerr);

			if (!r && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
				r = -errno;
			if (!r && soerr)
				r = -soerr;
			if (r) {
				err = r;
				close(fd);
				continue;
			}
		}
		int one = 1;
		int fl = fcntl(fd, F_GETFL);

		/* Small PDUs (capsules, R2T answers) must not wait for Nagle. */
		if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 || fl < 0 ||
		    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
			err = -errno;
			close(fd);
			continue;
		}
		freeaddrinfo(res);
		*out = fd;
		return 0;
	}
	freeaddrinfo(res);
	return err;
}

static int ic_exchange(struct fx_tcp_conn *c, int want_hdgst, int want_ddgst, int64_t deadline)
{
	struct nvme_tcp_icreq_pdu req;
	uint8_t asked = (uint8_t)((want_hdgst ? NVME_TCP_HDGST_ENABLE : 0) |
				  (want_ddgst ? NVME_TCP_DDGST_ENABLE : 0));

	memset(&req, 0, sizeof(req));
	fx_tcp_hdr_init(&req.hdr, NVME_TCP_ICREQ, 0, 0, 0, 0);
	req.pfv = 0;
	req.hpda = 0; /* we take C2H data at any dword offset */
	req.digest = asked;
	req.maxr2t = 0; /* one R2T at a time: we run one command at a time */
	struct iovec iov = {&req, sizeof(req)};
	int r = send_iov(c, &iov, 1, deadline);

	if (r)
		return r;

	union rx_hdr h;
	/* digests are off until ICResp has been read */
	c->hdgst = c->ddgst = 0;
	/* room for a C2HTermReq refusing us instead */
	r = recv_hdr(c, &h, FX_TCP_TERM_MAX, deadline);
	if (r < 0)
		return r;
	if (h.ch.type != NVME_TCP_ICRESP) {
		fx_nvmf_log("expected ICResp, got PDU type 0x%02x", h.ch.type);
		return proto_fail(c, NVME_TCP_FES_PDU_SEQ_ERR, 0, h.raw, h.ch.hlen);
	}
	const struct nvme_tcp_icresp_pdu *ic = &h.icresp;

	if (ic->pfv != 0 || ic->maxdata < 4096 || ic->cpda > 31 || (ic->digest & ~asked)) {
		fx_nvmf_log(
			"unusable ICResp: pfv %u maxh2cdata %u cpda %u digests 0x%x (asked 0x%x)",
			ic->pfv, ic->maxdata, ic->cpda, ic->digest, asked);
		uint32_t fei = ic->pfv              ? offsetof(struct nvme_tcp_icresp_pdu, pfv)
			       : ic->maxdata < 4096 ? offsetof(struct nvme_tcp_icresp_pdu, maxdata)
			       : ic->cpda > 31      ? offsetof(struct nvme_tcp_icresp_pdu, cpda)
						    : offsetof(struct nvme_tcp_icresp_pdu, digest);
		return proto_fail(
			c, ic->pfv ? NVME_TCP_FES_UNSUPPORTED_PARAM : NVME_TCP_FES_INVALID_PDU_HDR,
			fei, h.raw, h.ch.hlen);
	}
	/* The controller may grant fewer digests than asked; it decides. */
	c->hdgst = !!(ic->digest & NVME_TCP_HDGST_ENABLE);
	c->ddgst = !!(ic->digest & NVME_TCP_DDGST_ENABLE);
	c->cpda = ic->cpda;
	c->maxh2cdata = ic->maxdata;
	return 0;
}

/*
 * The secure channel's handshake, right after the TCP connect and before
 * ICReq: the TLS PSK and identity derived from the configured key for this
 * host and subsystem (version 0 identity, RFC 8446 derivation: what SPDK and
 * Linux look up).  Its failure reason is the thread's authentication error,
 * which the Python side shows.
 */
static int tls_start(struct fx_tcp_conn *c, const struct fx_nvmf_params *p, int64_t deadline)
{
	struct fx_tls_psk psk;
	const char *why = NULL;
	int r;

	fx_nvmf_auth_error_clear();
	if (!p->tls_key.len) {
		tls_fail("tls=1 needs a TLS key (tls_key)");
		return -EINVAL;
	}
	r = fx_tls_psk_derive(&p->tls_key, p->hostnqn, p->subnqn, 0, FX_TLS_KDF_RFC, &psk);
	if (r) {
		tls_fail("no TLS PSK identity can be made of these NQNs");
		return r;
	}
	r = fx_tls_client(c->fd, &psk, deadline, fx_nvmf_cancel_fd(), &c->tls, &why);
	fx_tls_psk_wipe(&psk);
	if (r && r != -ECANCELED)
		tls_fail("qid %u: TLS handshake failed: %s", c->qid, why ? why : "");
	if (r || p->ktls_off)
		return r;
	/* before ICReq, so every PDU of the queue, this path's and the data
	 * path's, rides the kernel's records where it has them; where it has
	 * not, ours go on (queue stats count which: transport/tcp.c) */
	r = fx_ktls_start(c->fd, c->tls, &c->ktls, &why);
	if (r == 0) {
		fx_tls_free(c->tls);
		c->tls = NULL;
	} else if (r == -ENOPROTOOPT) {
		r = 0;
	} else {
		tls_fail("qid %u: kTLS: %s", c->qid, why ? why : "");
	}
	return r;
}

int fx_tcp_connect(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p, uint16_t qid,
		   uint16_t sqsize, uint16_t cntlid, struct fx_tcp_conn *out, uint16_t *status)
{
	if (status)
		*status = 0;
	memset(out, 0, sizeof(*out));
	out->fd = -1;
	if (!fx_nvmf_nqn_ok(p->hostnqn) || !fx_nvmf_nqn_ok(p->subnqn) ||
	    strnlen(a->host, sizeof(a->host)) == sizeof(a->host) ||
	    strnlen(a->port, sizeof(a->port)) == sizeof(a->port))
		return -EINVAL;

	int64_t deadline = fx_nvmf_deadline_in(p->timeout_ms);
	int r = tcp_open(a, deadline, &out->fd);

	if (r)
		return r;
	out->timeout_ms = p->timeout_ms;
	out->qid = qid;
	out->sqsize = sqsize;
	/* Admin: NVMe/TCP's 8 KiB.  I/O: what the admin queue's Identify
	 * said (p->io_incap_max), for the AUTH_Send after Connect; the data
	 * path's own limit is the caller's (transport/tcp.c). */
	out->incap_max = qid == 0 ? ADMIN_INCAPSULE_MAX : p->io_incap_max;
	if (p->tls) {
		r = tls_start(out, p, deadline);
		if (r)
			goto fail;
	}
	r = ic_exchange(out, p->hdgst, p->ddgst, deadline);
	if (r)
		goto fail;

	struct nvmf_connect_data cd;
	struct nvme_sqe sqe;
	struct nvme_cqe cqe;

	fx_nvmf_connect_cmd(p, qid, sqsize, cntlid, &sqe, &cd);
	/* The 1024 bytes of Connect data always travel in-capsule, on any
	 * queue (IOCCSZ is not known before Connect). */
	r = exec_cmd(out, &sqe, &cd, sizeof(cd), 1, sizeof(cd), &cqe, 0);
	if (r == -EIO) {
		uint16_t sf = fx_nvmf_status_field(&cqe);

		if (status)
			*status = sf;
		r = fx_nvmf_connect_errno(sf);
		goto fail;
	}
	if (r)
		goto fail;
	out->cntlid = qid ? cntlid : (uint16_t)(cqe.dw0 & 0xffff);
	/* In-band authentication, when the Connect response asks for it. */
	r = fx_nvmf_auth_host(&fx_tcp_transport, out, p, qid, cqe.dw0, deadline);
	if (r)
		goto fail;
	return 0;
fail:
	fx_tcp_conn_close(out);
	return r;
}

void fx_tcp_conn_close(struct fx_tcp_conn *c)
{
	fx_tls_free(c->tls);
	c->tls = NULL;
	fx_ktls_free(c->ktls);
	c->ktls = NULL;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}

/* ------------------------------------------------ transport table */

static int tcp_q_connect(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p, uint16_t qid,
			 uint16_t sqsize, uint16_t cntlid, void *q, uint16_t *cntlid_out,
			 uint16_t *status)
{
	struct fx_tcp_conn *c = q;
	int r = fx_tcp_connect(a, p, qid, sqsize, cntlid, c, status);

	if (!r)
		*cntlid_out = c->cntlid;
	return r;
}

static int tcp_q_exec(void *q, struct nvme_sqe *sqe, void *data, uint32_t len, int write,
		      struct nvme_cqe *cqe, int timeout_ms)
{
	struct fx_tcp_conn *c = q;

	return exec_cmd(c, sqe, data, len, write, c->incap_max, cqe, timeout_ms);
}

/* Shut the socket down but keep the fd: a thread blocked in exec on it
 * wakes with an error, and the owner still closes it exactly once. */
static void tcp_q_shutdown(void *q)
{
	struct fx_tcp_conn *c = q;

	if (c->fd >= 0)
		shutdown(c->fd, SHUT_RDWR);
}

static void tcp_q_close(void *q)
{
	fx_tcp_conn_close(q);
}

const struct fx_nvmf_transport fx_tcp_transport = {
	.name = "tcp",
	.queue_size = sizeof(struct fx_tcp_conn),
	.connect = tcp_q_connect,
	.exec = tcp_q_exec,
	.shutdown = tcp_q_shutdown,
	.close = tcp_q_close,
};

int fx_tcp_prop_get(struct fx_tcp_conn *c, uint32_t off, int size8, uint64_t *val)
{
	return fx_nvmf_q_prop_get(&fx_tcp_transport, c, off, size8, val, 0);
}

int fx_tcp_prop_set(struct fx_tcp_conn *c, uint32_t off, int size8, uint64_t val)
{
	return fx_nvmf_q_prop_set(&fx_tcp_transport, c, off, size8, val, 0);
}

int fx_tcp_ctrl_open(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
		     uint16_t want_io_queues, struct fx_nvmf_ctrl **out, uint16_t *status)
{
	return fx_nvmf_ctrl_open(&fx_tcp_transport, a, p, want_io_queues, out, status);
}

int fx_tcp_discover(const struct fx_nvmf_addr *a, const struct fx_nvmf_params *p,
		    struct nvmf_disc_log_entry **entries, uint32_t *n, uint16_t *status)
{
	return fx_nvmf_discover(&fx_tcp_transport, a, p, entries, n, status);
}
