/*
 * NVMe/TCP TLS key material (csrc/nvme_tcp/tls_psk.c) against published
 * vectors: libnvme's test/psk.c (interchange strings and version 1
 * identities), SPDK's doc/nvmf.md key, RFC 8448 section 3's traffic key, and
 * retained / TLS PSK bytes from an independent model of the derivation that
 * reproduces every one of those upstream values.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "nvme_tcp/tls_psk.h"

static void hex(const char *h, uint8_t *out, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned v;

		CHECK(sscanf(h + 2 * i, "%2x", &v) == 1);
		out[i] = (uint8_t)v;
	}
	CHECK(strlen(h) == 2 * n);
}

static void check_bytes(const uint8_t *got, const char *want_hex, size_t n)
{
	uint8_t want[64];

	hex(want_hex, want, n);
	if (memcmp(got, want, n) != 0) {
		fprintf(stderr, "got  ");
		for (size_t i = 0; i < n; i++)
			fprintf(stderr, "%02x", got[i]);
		fprintf(stderr, "\nwant %s\n", want_hex);
	}
	CHECK(memcmp(got, want, n) == 0);
}

#define K32_01 "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
#define K48_02                                                                                    \
	"NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ=" \
	"=:"
#define K32_HEX "5512dbb6737d0106f65975b773dfb011ffc344bcf442e2dd6d8bc4870b5d5b03"
#define HOST "nqn.psk-test-host"
#define SUBSYS "nqn.psk-test-subsys"

static void test_parse(void)
{
	struct fx_tls_key k;
	const char *why;

	CHECK_EQ(fx_tls_key_parse(K32_01, &k, &why), 0);
	CHECK_EQ(k.hash, 1);
	CHECK_EQ(k.len, 32);
	check_bytes(k.key, K32_HEX, 32);
	CHECK_EQ(fx_tls_key_suite(&k), FX_TLS_HASH_SHA256);
	CHECK_EQ(fx_tls_key_parse(K48_02, &k, &why), 0);
	CHECK_EQ(k.hash, 2);
	CHECK_EQ(k.len, 48);
	check_bytes(k.key, K32_HEX "ffc344bcf442e2dd6d8bc4870b5d5b03", 48);
	CHECK_EQ(fx_tls_key_suite(&k), FX_TLS_HASH_SHA384);
	/* no closing ':' is accepted, as Linux does */
	CHECK_EQ(
		fx_tls_key_parse("NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ",
				 &k, &why),
		0);
	/* 00: no transform, suite by length */
	CHECK_EQ(fx_tls_key_parse(
			 "NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:", &k,
			 &why),
		 0);
	CHECK_EQ(k.hash, 0);
	CHECK_EQ(fx_tls_key_suite(&k), FX_TLS_HASH_SHA256);
	/* SPDK's documented key: 32 ASCII bytes */
	CHECK_EQ(fx_tls_key_parse(
			 "NVMeTLSkey-1:01:MDAxMTIyMzM0NDU1NjY3Nzg4OTlhYWJiY2NkZGVlZmZwJEiQ:", &k,
			 &why),
		 0);
	CHECK(memcmp(k.key, "00112233445566778899aabbccddeeff", 32) == 0);

	static const struct {
		const char *text, *why_has;
	} bad[] = {
		{"", "no TLS key"},
		{"DHHC-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:", "NVMeTLSkey-1:"},
		{"NVMeTLSkey-2:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
		 "NVMeTLSkey-1:"},
		{"NVMeTLSkey-1:03:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
		 "00, 01 or 02"},
		/* last CRC character changed */
		{"NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrY:", "CRC"},
		/* a key byte changed */
		{"NVMeTLSkey-1:01:WRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:", "CRC"},
		{"NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9Lr:", "32 or 48"},
		{"NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9L*Z:", "base64"},
		{"NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:x", "after"},
		/* a 48-byte key under 01 */
		{"NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ"
		 "==:",
		 "does not match"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&k, 0xab, sizeof(k));
		why = NULL;
		CHECK_EQ(fx_tls_key_parse(bad[i].text, &k, &why), -EINVAL);
		CHECK(why && strstr(why, bad[i].why_has));
		CHECK_EQ(k.len, 0);
		CHECK_EQ(k.key[0], 0);
	}
	CHECK_EQ(fx_tls_key_parse(NULL, &k, &why), -EINVAL);
	CHECK_EQ(fx_tls_key_parse(K32_01, NULL, NULL), -EINVAL);
}

static void test_derive(const char *text, enum fx_tls_kdf kdf, const char *retained,
			const char *psk_v0, const char *id_v1, const char *psk_v1)
{
	struct fx_tls_key k;
	struct fx_tls_psk p;
	uint8_t r[FX_TLS_PSK_MAX];

	CHECK_EQ(fx_tls_key_parse(text, &k, NULL), 0);
	if (retained) {
		CHECK_EQ(fx_tls_retained(&k, HOST, kdf, r), k.len);
		check_bytes(r, retained, k.len);
	}
	CHECK_EQ(fx_tls_psk_derive(&k, HOST, SUBSYS, 0, kdf, &p), 0);
	char want_id[128];

	snprintf(want_id, sizeof(want_id), "NVMe0R%02u " HOST " " SUBSYS, fx_tls_key_suite(&k));
	CHECK(strcmp(p.identity, want_id) == 0);
	CHECK_EQ(p.hash, fx_tls_key_suite(&k));
	check_bytes(p.psk, psk_v0, p.len);
	if (id_v1) {
		CHECK_EQ(fx_tls_psk_derive(&k, HOST, SUBSYS, 1, kdf, &p), 0);
		if (strcmp(p.identity, id_v1) != 0)
			fprintf(stderr, "got  %s\nwant %s\n", p.identity, id_v1);
		CHECK(strcmp(p.identity, id_v1) == 0);
		check_bytes(p.psk, psk_v1, p.len);
	}
}

static void test_vectors(void)
{
	test_derive(K32_01, FX_TLS_KDF_RFC,
		    "073311dec37e219ff3acd43f130130c5bdd443c066e1cc3424e49030234ff7d5",
		    "05c6503551ad136e6ee32e6eeb3f6d500b69701d84ec71e328f65c7f51566f68",
		    "NVMe1R01 " HOST " " SUBSYS " iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU=",
		    "8fc3c0badfd4c0c66fa3ca33aadd0314f85536cc9bc47338b60f3e6e563786ca");
	test_derive(K32_01, FX_TLS_KDF_COMPAT,
		    "ad4cdadfcbaf4e353fcbd09aac891c4d75c5300fe5ee7bb04ae87726a312eddc",
		    "09fb1983ac6d6d0353e7cae4f23daddd651c367fa347c59d9cf6936f5a83eafb",
		    "NVMe1R01 " HOST " " SUBSYS " 66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM=",
		    "b9f5ab2a41ba6e72a23a12066302a2f775fa6c0942c8e0b18ca8ac07edf305e2");
	test_derive(K48_02, FX_TLS_KDF_RFC,
		    "73973a1b51a9acdde29a0610ac6a3ef852cf45936cca6830a661d18f68502f1a4c7a8ecb37524e"
		    "0b1f7087cb4d680ad9",
		    "f42ba63824cdfe421914c582921f85b5b5b7e2d4df084caeedc9be20b212e8bb0fe8a23e9d59a1"
		    "c8fc6449da4970a78d",
		    "NVMe1R02 " HOST " " SUBSYS
		    " QhW2+Rp6RzHlNtCslyRxMnwJ11tKKhz8JCAQpQ+XUD8f9td1VeH5h53yz2wKJG1a",
		    "a2b2f943f479fc682555cec89857c80ed004ce92f32a973d5764155bb7e36b17a85368a0666d25"
		    "0afac9282dda2e62ca");
	test_derive(K48_02, FX_TLS_KDF_COMPAT,
		    "12d2452bc4783f50286bf940ad1caa05a304065e379024d9278ca7c9d8a42400c47029f198bfcd"
		    "f5f14c07cb04eb7306",
		    "2ee4754186a625b28a3936ef4a40d839c3ad958b2e017562ee07e2501f172ce999dc9c29033ea7"
		    "ee33f814f192c13f47",
		    "NVMe1R02 " HOST " " SUBSYS
		    " RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz",
		    "fcefe2e2a2e682b1447dcabf1ec268f78f08c63cd075753abcc8bda2c5c34d48d3014aa8d76ad8"
		    "0107e4f5c9f27e2149");
	/* HH 00: the configured key is the retained one */
	test_derive("NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
		    FX_TLS_KDF_RFC, K32_HEX,
		    "ec85300ba827726bd3bc4fc07f3a34aec5fe7c8ccac05fefc2f021c74e0df9ef", NULL, NULL);

	/* SPDK's documented key with its reference identity */
	struct fx_tls_key k;
	struct fx_tls_psk p;

	CHECK_EQ(fx_tls_key_parse(
			 "NVMeTLSkey-1:01:MDAxMTIyMzM0NDU1NjY3Nzg4OTlhYWJiY2NkZGVlZmZwJEiQ:", &k,
			 NULL),
		 0);
	CHECK_EQ(fx_tls_psk_derive(&k, "nqn.2016-06.io.spdk:host1", "nqn.2016-06.io.spdk:cnode1", 0,
				   FX_TLS_KDF_RFC, &p),
		 0);
	CHECK(strcmp(p.identity, "NVMe0R01 nqn.2016-06.io.spdk:host1 nqn.2016-06.io.spdk:cnode1") ==
	      0);
	check_bytes(p.psk, "45956d30221db43e664e8d6e78a79c31a81824cbd12acfdaca0e6032b335bbd9", 32);

	/* NQNs that would break an identity apart, or not fit in one */
	char longnqn[300];

	memset(longnqn, 'a', sizeof(longnqn) - 1);
	longnqn[sizeof(longnqn) - 1] = '\0';
	CHECK_EQ(fx_tls_psk_derive(&k, "nqn.a b", SUBSYS, 0, FX_TLS_KDF_RFC, &p), -EINVAL);
	CHECK_EQ(fx_tls_psk_derive(&k, HOST, "", 0, FX_TLS_KDF_RFC, &p), -EINVAL);
	CHECK_EQ(fx_tls_psk_derive(&k, HOST, longnqn, 1, FX_TLS_KDF_RFC, &p), -ENAMETOOLONG);
	CHECK_EQ(fx_tls_psk_derive(&k, HOST, SUBSYS, 2, FX_TLS_KDF_RFC, &p), -EINVAL);
	CHECK_EQ(p.len, 0);
}

static void test_expand_label(void)
{
	/* RFC 8448 section 3: server handshake traffic secret -> key, iv */
	uint8_t s[32], out[16];

	hex("b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38", s, 32);
	CHECK_EQ(fx_tls_expand_label(FX_TLS_HASH_SHA256, s, 32, "key", NULL, 0, out, 16), 0);
	check_bytes(out, "3fce516009c21727d0f2e4e86ee403bc", 16);
	CHECK_EQ(fx_tls_expand_label(FX_TLS_HASH_SHA256, s, 32, "iv", NULL, 0, out, 12), 0);
	check_bytes(out, "5d313eb2671276ee13000b30", 12);
}

static void test_identity_parse(void)
{
	struct fx_tls_identity id;
	static const char v0[] = "NVMe0R01 " HOST " " SUBSYS;
	static const char v1[] = "NVMe1R02 " HOST " " SUBSYS " abc=";

	CHECK_EQ(fx_tls_identity_parse(v0, strlen(v0), &id), 0);
	CHECK_EQ(id.version, 0);
	CHECK_EQ(id.hash, 1);
	CHECK(strcmp(id.hostnqn, HOST) == 0 && strcmp(id.subnqn, SUBSYS) == 0);
	CHECK(strcmp(id.digest, "") == 0);
	CHECK_EQ(fx_tls_identity_parse(v1, strlen(v1), &id), 0);
	CHECK_EQ(id.version, 1);
	CHECK_EQ(id.hash, 2);
	CHECK(strcmp(id.digest, "abc=") == 0);

	static const char *bad[] = {
		"NVMe0G01 " HOST " " SUBSYS,          /* generated PSK */
		"NVMe2R01 " HOST " " SUBSYS,          /* unknown version */
		"NVMe0R03 " HOST " " SUBSYS,          /* unknown hash */
		"NVMe0R01 " HOST,                     /* no subsystem */
		"NVMe0R01 " HOST " " SUBSYS " extra", /* v0 with a digest */
		"NVMe1R01 " HOST " " SUBSYS,          /* v1 without one */
		"NVMe1R01 " HOST " " SUBSYS " a b",   /* digest with a space */
		"NVMe0R01  " SUBSYS,                  /* empty host NQN */
		"NVMe0R01 " HOST " " SUBSYS "\x01",   /* control character */
		"nvme0R01 " HOST " " SUBSYS,
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK_EQ(fx_tls_identity_parse(bad[i], strlen(bad[i]), &id), -EINVAL);
	/* a NUL inside the wire bytes */
	CHECK_EQ(fx_tls_identity_parse(v0, sizeof(v0), &id), -EINVAL);
	/* longer than any identity */
	char big[FX_TLS_IDENTITY_MAX + 8];

	memset(big, 'a', sizeof(big));
	memcpy(big, "NVMe0R01 ", 9);
	CHECK_EQ(fx_tls_identity_parse(big, sizeof(big), &id), -EINVAL);
	CHECK_EQ(fx_tls_identity_parse(v0, 5, &id), -EINVAL);
}

int main(void)
{
	test_parse();
	test_vectors();
	test_expand_label();
	test_identity_parse();
	printf("test_tls_psk: ok\n");
	return 0;
}
