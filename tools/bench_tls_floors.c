/*
 * What each step of a TLS read costs one thread on this machine, in CPU
 * seconds per GB, without fx100io around it: the floor under what
 * tools/bench_tls.py measures (it builds and runs this with --floors).
 *
 *   pread       256 KiB at a time from the page cache (our target's read of cached data)
 *   seal        AES-128-GCM, 16 KiB records, through EVP as csrc/nvme_tcp/tls.c does
 *   pread+seal  both, as our target does them in turn
 *   send        128 KiB sendmsg() on loopback TCP (the sender's thread)
 *   recv        1 MiB recv() of the same (the receiver's thread)
 *
 *   cc -O2 -o /tmp/bench_tls_floors tools/bench_tls_floors.c -lcrypto -lpthread
 *   /tmp/bench_tls_floors FILE      (FILE: a file in the page cache, 1 MiB or more)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define GB (1ul << 30)
#define CHUNK (256u << 10)
#define REC 16384u

static double cpu_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void report(const char *what, double s, size_t bytes)
{
	printf("%-11s %.3f CPU s/GB\n", what, s / ((double)bytes / 1e9));
}

static int rfd;

static void *reader(void *arg)
{
	uint8_t *b = malloc(1 << 20);
	size_t n = 0;
	double c0 = cpu_s();
	ssize_t r;

	(void)arg;
	while (b && (r = recv(rfd, b, 1 << 20, 0)) > 0)
		n += (size_t)r;
	report("recv", cpu_s() - c0, n ? n : 1);
	free(b);
	return NULL;
}

/* Seal n bytes of in as 16 KiB records into out (tags are not kept). */
static void seal(EVP_CIPHER_CTX *x, const uint8_t *in, uint8_t *out, size_t n)
{
	static const uint8_t hdr[5] = {23, 3, 3, 0x40, 0x11};
	uint8_t iv[12] = {0}, tag[16];
	int len;

	for (size_t r = 0; r < n; r += REC) {
		EVP_EncryptInit_ex(x, NULL, NULL, NULL, iv);
		EVP_EncryptUpdate(x, NULL, &len, hdr, sizeof(hdr));
		EVP_EncryptUpdate(x, out + r, &len, in + r, REC);
		EVP_EncryptFinal_ex(x, out + r, &len);
		EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, 16, tag);
		iv[11]++;
	}
}

int main(int argc, char **argv)
{
	static const uint8_t key[16] = {1};
	uint8_t *buf = aligned_alloc(4096, CHUNK), *out = aligned_alloc(4096, CHUNK);
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
	int fd = argc == 2 ? open(argv[1], O_RDONLY) : -1;
	off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : 0;
	size_t off = 0;
	double c0;

	if (!buf || !out || !x || size < (off_t)CHUNK ||
	    !EVP_EncryptInit_ex(x, EVP_aes_128_gcm(), NULL, key, NULL)) {
		fprintf(stderr, "usage: %s FILE (in the page cache, 256 KiB or more)\n", argv[0]);
		return 2;
	}
	for (off = 0; off + CHUNK <= (size_t)size; off += CHUNK) /* (into the page cache) */
		if (pread(fd, buf, CHUNK, (off_t)off) != (ssize_t)CHUNK)
			return 1;
	c0 = cpu_s();
	for (size_t d = 0; d < GB; d += CHUNK, off += CHUNK) {
		if (off + CHUNK > (size_t)size)
			off = 0;
		if (pread(fd, buf, CHUNK, (off_t)off) != (ssize_t)CHUNK)
			return 1;
	}
	report("pread", cpu_s() - c0, GB);
	c0 = cpu_s();
	for (size_t d = 0; d < GB; d += CHUNK)
		seal(x, buf, out, CHUNK);
	report("seal", cpu_s() - c0, GB);
	c0 = cpu_s();
	for (size_t d = 0; d < GB; d += CHUNK, off += CHUNK) {
		if (off + CHUNK > (size_t)size)
			off = 0;
		if (pread(fd, buf, CHUNK, (off_t)off) != (ssize_t)CHUNK)
			return 1;
		seal(x, buf, out, CHUNK);
	}
	report("pread+seal", cpu_s() - c0, GB);

	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	int ls = socket(AF_INET, SOCK_STREAM, 0), s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	pthread_t th;

	if (ls < 0 || s < 0 || bind(ls, (struct sockaddr *)&a, al) || listen(ls, 1) ||
	    getsockname(ls, (struct sockaddr *)&a, &al) || connect(s, (struct sockaddr *)&a, al) ||
	    (rfd = accept(ls, NULL, NULL)) < 0)
		return 1;
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (pthread_create(&th, NULL, reader, NULL))
		return 1;
	c0 = cpu_s();
	for (size_t d = 0; d < GB; d += 128u << 10)
		if (send(s, out, 128u << 10, 0) != 128 << 10)
			return 1;
	report("send", cpu_s() - c0, GB);
	shutdown(s, SHUT_WR);
	pthread_join(th, NULL);
	EVP_CIPHER_CTX_free(x);
	return 0;
}
