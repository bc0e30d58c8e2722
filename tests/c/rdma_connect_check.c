/*
 * Our NVMe/RDMA connect path (transport/rdma_conn.c) on one queue, printed
 * as one JSON line in the shape of tests/support/rdma_cm_check.py (the pyverbs
 * implementation), so a test can compare the two against the same target:
 *
 *   tests/c/build/rdma_connect_check ADDR PORT SUBNQN HOSTNQN [HSQSIZE]
 *
 * Connects the admin queue (qid 0) with HSQSIZE (0's based, default 31),
 * reads CAP with Property Get, closes.  Exit 0 when connected, 1 otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/nvmf.h"
#include "transport/rdma_conn.h"

int main(int argc, char **argv)
{
	struct fx_nvmf_addr a;
	struct fx_nvmf_params p;
	struct fx_rdma_conn c;
	uint16_t status = 0;
	uint64_t cap = 0;

	if (argc < 5) {
		fprintf(stderr, "usage: %s ADDR PORT SUBNQN HOSTNQN [HSQSIZE]\n", argv[0]);
		return 2;
	}
	memset(&a, 0, sizeof(a));
	memset(&p, 0, sizeof(p));
	snprintf(a.host, sizeof(a.host), "%s", argv[1]);
	snprintf(a.port, sizeof(a.port), "%s", argv[2]);
	snprintf(p.subnqn, sizeof(p.subnqn), "%s", argv[3]);
	snprintf(p.hostnqn, sizeof(p.hostnqn), "%s", argv[4]);
	p.timeout_ms = 10000;
	uint16_t sqsize = (uint16_t)(argc > 5 ? atoi(argv[5]) : 31);

	int r = fx_rdma_connect(&a, &p, 0, sqsize, 0xFFFF, &c, &status);
	if (r == 0)
		r = fx_nvmf_q_prop_get(&fx_rdma_transport, &c, NVME_REG_CAP, 1, &cap, 0);
	printf("{\"connected\": %s, \"crqsize\": %u, \"cntlid\": %u, \"connect_status\": %u, "
	       "\"cap\": %llu, \"errno\": %d, \"error\": \"%s\"}\n",
	       r == 0 ? "true" : "false", r == 0 ? c.crqsize : 0, r == 0 ? c.cntlid : 0, status,
	       (unsigned long long)cap, -r, r ? strerror(-r) : "");
	if (r == 0 || c.id)
		fx_rdma_close(&c);
	return r == 0 ? 0 : 1;
}
