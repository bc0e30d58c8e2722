/*
 * Minimal assertion helpers for the C unit tests.  Not assert(): these must
 * stay active under -DNDEBUG and say where and with which values they failed.
 */
#ifndef FX_TEST_CHECK_H
#define FX_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                              \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fflush(stdout);                                                          \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                                                 \
		}                                                                                \
	} while (0)

/* Compare as signed 64-bit so -errno results print readably. */
#define CHECK_EQ(a, b)                                                                      \
	do {                                                                                \
		long long a_ = (long long)(a), b_ = (long long)(b);                         \
		if (a_ != b_) {                                                             \
			fflush(stdout);                                                     \
			fprintf(stderr,                                                     \
				"%s:%d: CHECK failed: %s == %s "                            \
				"(%lld / 0x%llx vs %lld / 0x%llx)\n",                       \
				__FILE__, __LINE__, #a, #b, a_, (unsigned long long)a_, b_, \
				(unsigned long long)b_);                                    \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

/* splitmix64: deterministic, seedable, good enough for test sequences. */
static inline uint64_t test_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Seed from FX_TEST_SEED to replay a failure; printed by each test. */
static inline uint64_t test_seed(void)
{
	const char *s = getenv("FX_TEST_SEED");

	return s ? strtoull(s, NULL, 0) : 0x5eed5eed12345678ULL;
}

#endif
