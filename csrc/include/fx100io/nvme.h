/*
 * NVMe, NVMe over Fabrics and NVMe/TCP wire formats, with the field names of
 * the specifications (NVMe Base 2.0, NVMe-oF 1.1, NVMe/TCP Transport 1.0).
 * All multi-byte fields are little endian on the wire; this header targets
 * little-endian hosts (x86-64, aarch64) and asserts sizes and offsets so a
 * layout mistake fails the build, not the wire.
 *
 * Shared by the initiator (csrc/host/, csrc/transport/tcp_ctrl.c,
 * csrc/transport/tcp.c) and our target (csrc/target/).
 */
#ifndef FX100IO_NVME_H
#define FX100IO_NVME_H

#include <stddef.h>
#include <stdint.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fx100io's NVMe structs assume a little-endian host"
#endif

#define FX_PACKED __attribute__((packed))

/* ------------------------------------------------------ NVMe/TCP PDUs */

enum nvme_tcp_pdu_type {
	NVME_TCP_ICREQ = 0x00,
	NVME_TCP_ICRESP = 0x01,
	NVME_TCP_H2C_TERM = 0x02,
	NVME_TCP_C2H_TERM = 0x03,
	NVME_TCP_CMD = 0x04,
	NVME_TCP_RSP = 0x05,
	NVME_TCP_H2C_DATA = 0x06,
	NVME_TCP_C2H_DATA = 0x07,
	NVME_TCP_R2T = 0x09,
};

enum nvme_tcp_pdu_flags {
	NVME_TCP_F_HDGST = 0x01,
	NVME_TCP_F_DDGST = 0x02,
	NVME_TCP_F_DATA_LAST = 0x04,
	NVME_TCP_F_DATA_SUCCESS = 0x08,
};

/* ICReq/ICResp DGST field */
#define NVME_TCP_HDGST_ENABLE 0x01
#define NVME_TCP_DDGST_ENABLE 0x02
#define NVME_TCP_DIGEST_LEN 4

/* Common header of every PDU. */
struct nvme_tcp_hdr {
	uint8_t type;
	uint8_t flags;
	uint8_t hlen;
	uint8_t pdo;
	uint32_t plen;
} FX_PACKED;
_Static_assert(sizeof(struct nvme_tcp_hdr) == 8, "CH");

struct nvme_tcp_icreq_pdu {
	struct nvme_tcp_hdr hdr;
	uint16_t pfv;    /* 0: NVMe/TCP 1.0 */
	uint8_t hpda;    /* host PDU data alignment, 4-byte units, 0's based */
	uint8_t digest;  /* NVME_TCP_*DGST_ENABLE */
	uint32_t maxr2t; /* 0's based */
	uint8_t rsvd[112];
} FX_PACKED;
_Static_assert(sizeof(struct nvme_tcp_icreq_pdu) == 128, "ICReq");

struct nvme_tcp_icresp_pdu {
	struct nvme_tcp_hdr hdr;
	uint16_t pfv;
	uint8_t cpda;
	uint8_t digest;
	uint32_t maxdata; /* MAXH2CDATA, bytes */
	uint8_t rsvd[112];
} FX_PACKED;
_Static_assert(sizeof(struct nvme_tcp_icresp_pdu) == 128, "ICResp");
_Static_assert(offsetof(struct nvme_tcp_icresp_pdu, maxdata) == 12, "MAXH2CDATA");

/* H2CTermReq / C2HTermReq: header, then up to 152 bytes of the bad PDU. */
struct nvme_tcp_term_pdu {
	struct nvme_tcp_hdr hdr;
	uint16_t fes;
	uint16_t feil;
	uint16_t feiu;
	uint8_t rsvd[10];
} FX_PACKED;
_Static_assert(sizeof(struct nvme_tcp_term_pdu) == 24, "TermReq");

enum nvme_tcp_fatal_error_status {
	NVME_TCP_FES_INVALID_PDU_HDR = 0x01,
	NVME_TCP_FES_PDU_SEQ_ERR = 0x02,
	NVME_TCP_FES_HDR_DIGEST_ERR = 0x03,
	NVME_TCP_FES_DATA_OUT_OF_RANGE = 0x04,
	NVME_TCP_FES_R2T_LIMIT_EXCEEDED = 0x05,
	NVME_TCP_FES_DATA_LIMIT_EXCEEDED = 0x05,
	NVME_TCP_FES_UNSUPPORTED_PARAM = 0x06,
};

/* H2CData, C2HData (same layout) */
struct nvme_tcp_data_pdu {
	struct nvme_tcp_hdr hdr;
	uint16_t cccid; /* command capsule CID */
	uint16_t ttag;  /* transfer tag from the R2T (H2C) */
	uint32_t datao; /* offset within the command's data */
	uint32_t datal; /* bytes in this PDU */
	uint8_t rsvd[4];
} FX_PACKED;
_Static_assert(sizeof(struct nvme_tcp_data_pdu) == 24, "Data PDU");

struct nvme_tcp_r2t_pdu {
	struct nvme_tcp_hdr hdr;
	uint16_t cccid;
	uint16_t ttag;
	uint32_t r2to;
	uint32_t r2tl;
	uint8_t rsvd[4];
} FX_PACKED;
_Static_assert(sizeof(struct nvme_tcp_r2t_pdu) == 24, "R2T");

/* ------------------------------------------------- NVMe commands (SQE) */

/* SGL descriptor (16 bytes); type = descriptor type << 4 | subtype */
struct nvme_sgl_desc {
	uint64_t addr;
	uint32_t length;
	uint8_t rsvd[3];
	uint8_t type;
} FX_PACKED;
_Static_assert(sizeof(struct nvme_sgl_desc) == 16, "SGL");

#define NVME_SGL_DATA_BLOCK_OFFSET 0x01    /* data block, offset: in-capsule */
#define NVME_SGL_TRANSPORT_DATA_BLOCK 0x5A /* transport data block, transport A */
#define NVME_SGL_KEYED_DATA_BLOCK 0x40     /* keyed data block, address (RDMA) */
#define NVME_SGL_KEYED_DATA_BLOCK_INV 0x4F /* ... and the target invalidates the key */

/* PSDT = 01b: SGLs for data, metadata in one contiguous buffer. Fabrics
 * commands must use SGLs. */
#define NVME_CMD_SGL_METABUF 0x40

struct nvme_sqe {
	uint8_t opcode;
	uint8_t flags;
	uint16_t cid;
	uint32_t nsid;
	uint32_t cdw2;
	uint32_t cdw3;
	uint64_t mptr;
	struct nvme_sgl_desc dptr;
	uint32_t cdw10;
	uint32_t cdw11;
	uint32_t cdw12;
	uint32_t cdw13;
	uint32_t cdw14;
	uint32_t cdw15;
} FX_PACKED;
_Static_assert(sizeof(struct nvme_sqe) == 64, "SQE");
_Static_assert(offsetof(struct nvme_sqe, dptr) == 24, "DPTR");
_Static_assert(offsetof(struct nvme_sqe, cdw10) == 40, "CDW10");

struct nvme_cqe {
	uint32_t dw0; /* command specific result */
	uint32_t dw1;
	uint16_t sqhd;
	uint16_t sqid;
	uint16_t cid;
	uint16_t status; /* bit 0: phase tag; bits 1-15: status field */
} FX_PACKED;
_Static_assert(sizeof(struct nvme_cqe) == 16, "CQE");

/* The status field (status >> 1): SC bits 0-7, SCT bits 8-10, CRD 11-12,
 * M bit 13, DNR bit 14.  fx_cqe.status carries exactly this. */
#define NVME_STATUS_FIELD(st) ((uint16_t)((st) >> 1))
#define NVME_SC(sf) ((sf)&0xFF)
#define NVME_SCT(sf) (((sf) >> 8) & 0x7)
#define NVME_DNR 0x4000

/* Generic command status codes (SCT 0) we name in logs and tests. */
#define NVME_SC_SUCCESS 0x00
#define NVME_SC_INVALID_OPCODE 0x01
#define NVME_SC_INVALID_FIELD 0x02
#define NVME_SC_CMDID_CONFLICT 0x03
#define NVME_SC_DATA_XFER_ERROR 0x04
#define NVME_SC_INTERNAL 0x06
#define NVME_SC_SGL_INVALID_OFFSET 0x16
#define NVME_SC_SGL_INVALID_TYPE 0x11
#define NVME_SC_LBA_RANGE 0x80
#define NVME_SC_CAP_EXCEEDED 0x81
#define NVME_SC_NS_NOT_READY 0x82
/* SCT 1 (command specific) for Fabrics Connect */
#define NVME_SC_CONNECT_INCOMPATIBLE_FORMAT 0x80
#define NVME_SC_CONNECT_CTRL_BUSY 0x81
#define NVME_SC_CONNECT_INVALID_PARAM 0x82
#define NVME_SC_CONNECT_RESTART_DISC 0x83
#define NVME_SC_CONNECT_INVALID_HOST 0x84

enum nvme_admin_opcode {
	NVME_ADMIN_GET_LOG_PAGE = 0x02,
	NVME_ADMIN_IDENTIFY = 0x06,
	NVME_ADMIN_SET_FEATURES = 0x09,
	NVME_ADMIN_GET_FEATURES = 0x0a,
	NVME_ADMIN_ASYNC_EVENT = 0x0c,
	NVME_ADMIN_KEEP_ALIVE = 0x18,
};

enum nvme_io_opcode {
	NVME_CMD_FLUSH = 0x00,
	NVME_CMD_WRITE = 0x01,
	NVME_CMD_READ = 0x02,
	NVME_CMD_WRITE_ZEROES = 0x08,
};

#define NVME_FABRICS_OPCODE 0x7f
enum nvmf_fctype {
	NVMF_FCTYPE_PROP_SET = 0x00,
	NVMF_FCTYPE_CONNECT = 0x01,
	NVMF_FCTYPE_PROP_GET = 0x04,
};

#define NVME_ID_CNS_NS 0x00
#define NVME_ID_CNS_CTRL 0x01
#define NVME_ID_CNS_NS_ACTIVE_LIST 0x02
#define NVME_FEAT_NUM_QUEUES 0x07
#define NVME_LOG_DISCOVERY 0x70

/* Fabrics commands overlay the SQE (fctype sits where nsid starts). */
struct nvmf_connect_cmd {
	uint8_t opcode;
	uint8_t rsvd1;
	uint16_t cid;
	uint8_t fctype;
	uint8_t rsvd2[19];
	struct nvme_sgl_desc dptr;
	uint16_t recfmt;
	uint16_t qid;
	uint16_t sqsize; /* 0's based */
	uint8_t cattr;
	uint8_t rsvd3;
	uint32_t kato; /* keep alive timeout, ms */
	uint8_t rsvd4[12];
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_connect_cmd) == 64, "Connect");
_Static_assert(offsetof(struct nvmf_connect_cmd, qid) == 42, "Connect.qid");
_Static_assert(offsetof(struct nvmf_connect_cmd, kato) == 48, "Connect.kato");

struct nvmf_connect_data {
	uint8_t hostid[16];
	uint16_t cntlid; /* 0xFFFF: dynamic controller */
	uint8_t rsvd4[238];
	char subsysnqn[256];
	char hostnqn[256];
	uint8_t rsvd5[256];
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_connect_data) == 1024, "Connect data");
_Static_assert(offsetof(struct nvmf_connect_data, subsysnqn) == 256, "subnqn");
_Static_assert(offsetof(struct nvmf_connect_data, hostnqn) == 512, "hostnqn");

struct nvmf_property_cmd {
	uint8_t opcode;
	uint8_t rsvd1;
	uint16_t cid;
	uint8_t fctype;
	uint8_t rsvd2[35];
	uint8_t attrib; /* 0: 4 bytes, 1: 8 bytes */
	uint8_t rsvd3[3];
	uint32_t offset;
	uint64_t value; /* Property Set */
	uint8_t rsvd4[8];
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_property_cmd) == 64, "Property");
_Static_assert(offsetof(struct nvmf_property_cmd, attrib) == 40, "attrib");
_Static_assert(offsetof(struct nvmf_property_cmd, value) == 48, "value");

/* Controller properties */
#define NVME_REG_CAP 0x00
#define NVME_REG_VS 0x08
#define NVME_REG_CC 0x14
#define NVME_REG_CSTS 0x1c
#define NVME_CAP_MQES(cap) ((uint32_t)((cap)&0xffff))            /* 0's based */
#define NVME_CAP_TIMEOUT(cap) ((uint32_t)(((cap) >> 24) & 0xff)) /* 500 ms units */
#define NVME_CC_ENABLE 0x1
#define NVME_CC_CSS_NVM (0u << 4)
#define NVME_CC_MPS_4K (0u << 7)
#define NVME_CC_AMS_RR (0u << 11)
#define NVME_CC_SHN_NORMAL (1u << 14)
#define NVME_CC_IOSQES (6u << 16)
#define NVME_CC_IOCQES (4u << 20)
#define NVME_CSTS_RDY 0x1
#define NVME_CSTS_CFS 0x2
#define NVME_CSTS_SHST_CMPLT (2u << 2)

/* Offsets into Identify Controller (4096 bytes). */
#define NVME_IDC_MDTS 77
#define NVME_IDC_CNTLID 78
#define NVME_IDC_VER 80
#define NVME_IDC_KAS 320
#define NVME_IDC_MAXCMD 514
#define NVME_IDC_NN 516
#define NVME_IDC_SGLS 536
#define NVME_IDC_SUBNQN 768
#define NVME_IDC_IOCCSZ 1792
#define NVME_IDC_IORCSZ 1796
#define NVME_IDC_ICDOFF 1800
#define NVME_IDC_MSDBD 1803

/* Offsets into Identify Namespace. */
#define NVME_IDNS_NSZE 0
#define NVME_IDNS_NCAP 8
#define NVME_IDNS_NLBAF 25
#define NVME_IDNS_FLBAS 26
#define NVME_IDNS_LBAF 128 /* 4-byte entries: MS u16, LBADS u8, RP u8 */

/* Discovery log page (LID 0x70). */
struct nvmf_disc_log_entry {
	uint8_t trtype;  /* 1 RDMA, 3 TCP */
	uint8_t adrfam;  /* 1 IPv4, 2 IPv6 */
	uint8_t subtype; /* 1 referral, 2 NVM subsystem, 3 current discovery */
	uint8_t treq;
	uint16_t portid;
	uint16_t cntlid;
	uint16_t asqsz;
	uint16_t eflags;
	uint8_t rsvd12[20];
	char trsvcid[32];
	uint8_t rsvd64[192];
	char subnqn[256];
	char traddr[256];
	uint8_t tsas[256];
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_disc_log_entry) == 1024, "disc entry");
_Static_assert(offsetof(struct nvmf_disc_log_entry, trsvcid) == 32, "trsvcid");
_Static_assert(offsetof(struct nvmf_disc_log_entry, subnqn) == 256, "subnqn");
_Static_assert(offsetof(struct nvmf_disc_log_entry, traddr) == 512, "traddr");

struct nvmf_disc_log_hdr {
	uint64_t genctr;
	uint64_t numrec;
	uint16_t recfmt;
	uint8_t rsvd[1006];
} FX_PACKED;
_Static_assert(sizeof(struct nvmf_disc_log_hdr) == 1024, "disc hdr");

#define NVMF_TRTYPE_RDMA 1
#define NVMF_TRTYPE_TCP 3
#define NVMF_ADRFAM_IPV4 1
#define NVMF_ADRFAM_IPV6 2
#define NVMF_SUBTYPE_DISCOVERY_REFERRAL 1
#define NVMF_SUBTYPE_NVME 2
#define NVMF_SUBTYPE_CURRENT_DISCOVERY 3
#define NVMF_DISCOVERY_NQN "nqn.2014-08.org.nvmexpress.discovery"

#define NVMF_NQN_SIZE 256

/* ---- multipath: namespace identifiers and ANA (NVMe Base 2.0) ----
 * What the host needs to recognise one namespace behind several
 * controllers and to follow its Asymmetric Namespace Access state. */
#define NVME_ID_CNS_NS_DESC_LIST 0x03 /* Namespace Identification Descriptors */
#define NVME_IDNS_ANAGRPID 92         /* u32 */
#define NVME_IDNS_NGUID 104           /* 16 bytes */
#define NVME_IDNS_EUI64 120           /* 8 bytes */
/* A Namespace Identification Descriptor: NIDT, NIDL, 2 reserved, then NIDL
 * bytes of identifier; the list ends at a NIDT of 0 or after 4096 bytes. */
struct nvme_ns_id_desc {
	uint8_t nidt;
	uint8_t nidl;
	uint8_t rsvd[2];
};
_Static_assert(sizeof(struct nvme_ns_id_desc) == 4, "NS id descriptor header");
#define NVME_NIDT_EUI64 0x1 /* NIDL 8 */
#define NVME_NIDT_NGUID 0x2 /* NIDL 16 */
#define NVME_NIDT_UUID 0x3  /* NIDL 16 */
/* Asymmetric Namespace Access (NVMe Base 2.0, 8.1.1): the ANA log page
 * (LID 0Ch; Get Log Page LSP bit 0 = RGO, only the groups without their
 * NSID lists), the states a group has as seen through a port, the
 * path-related statuses (SCT 3) of I/O on a path that cannot serve it,
 * and the ANA change notice an Asynchronous Event Request completes with. */
#define NVME_LOG_ANA 0x0C
#define NVME_ANA_LSP_RGO 0x01
#define NVME_ANA_OPTIMIZED 0x01
#define NVME_ANA_NON_OPTIMIZED 0x02
#define NVME_ANA_INACCESSIBLE 0x03
#define NVME_ANA_PERSISTENT_LOSS 0x04
#define NVME_ANA_CHANGE 0x0F
#define NVME_SCT_PATH 0x3
#define NVME_SC_ANA_PERSISTENT_LOSS 0x01
#define NVME_SC_ANA_INACCESSIBLE 0x02
#define NVME_SC_ANA_TRANSITION 0x03
/* AER completion dw0: type Notice (2h), info ANA change (03h), log 0Ch */
#define NVME_AER_ANA_CHANGE 0x000C0302u
#define NVME_AEN_CFG_ANA_CHANGE (1u << 11) /* OAES bit and AEC (feature 0Bh) bit */

struct nvme_ana_log_hdr {
	uint64_t chgcnt;
	uint16_t ngrps;
	uint8_t rsvd[6];
} FX_PACKED;
_Static_assert(sizeof(struct nvme_ana_log_hdr) == 16, "ana hdr");

/* followed by nnsids 32-bit NSIDs (none when RGO was set) */
struct nvme_ana_group_desc {
	uint32_t grpid;
	uint32_t nnsids;
	uint64_t chgcnt;
	uint8_t state; /* bits 3:0 */
	uint8_t rsvd[15];
} FX_PACKED;
_Static_assert(sizeof(struct nvme_ana_group_desc) == 32, "ana desc");

#endif
