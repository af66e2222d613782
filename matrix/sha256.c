/*
 * sha256.c
 *		SHA-256 (FIPS 180-4) of a file or a buffer, as hex: what a sign-off
 *		report records of the job file and the job's code (provenance.c).
 *
 * Written here rather than taken from libpgcommon, whose frontend
 * cryptohash goes through OpenSSL on Debian and would need libcrypto at
 * link time.
 */
#include "postgres_fe.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

typedef struct sha256_ctx
{
	uint32_t	h[8];
	uint64_t	bytes;
	unsigned char block[64];
	size_t		used;
} sha256_ctx;

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void
compress(sha256_ctx *c, const unsigned char *p)
{
	uint32_t	w[64];
	uint32_t	a,
				b,
				cc,
				d,
				e,
				f,
				g,
				h;
	int			i;

	for (i = 0; i < 16; i++)
		w[i] = (uint32_t) p[4 * i] << 24 | (uint32_t) p[4 * i + 1] << 16 |
			(uint32_t) p[4 * i + 2] << 8 | (uint32_t) p[4 * i + 3];
	for (i = 16; i < 64; i++)
	{
		uint32_t	s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t	s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);

		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	a = c->h[0];
	b = c->h[1];
	cc = c->h[2];
	d = c->h[3];
	e = c->h[4];
	f = c->h[5];
	g = c->h[6];
	h = c->h[7];
	for (i = 0; i < 64; i++)
	{
		uint32_t	t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
		uint32_t	t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));

		h = g;
		g = f;
		f = e;
		e = d + t1;
		d = cc;
		cc = b;
		b = a;
		a = t1 + t2;
	}
	c->h[0] += a;
	c->h[1] += b;
	c->h[2] += cc;
	c->h[3] += d;
	c->h[4] += e;
	c->h[5] += f;
	c->h[6] += g;
	c->h[7] += h;
}

static void
sha256_init(sha256_ctx *c)
{
	static const uint32_t h0[8] = {
		0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
	};

	memcpy(c->h, h0, sizeof(h0));
	c->bytes = 0;
	c->used = 0;
}

static void
sha256_update(sha256_ctx *c, const void *data, size_t n)
{
	const unsigned char *p = data;

	c->bytes += n;
	while (n > 0)
	{
		size_t		take = 64 - c->used;

		if (take > n)
			take = n;
		memcpy(c->block + c->used, p, take);
		c->used += take;
		p += take;
		n -= take;
		if (c->used == 64)
		{
			compress(c, c->block);
			c->used = 0;
		}
	}
}

static void
sha256_hex(sha256_ctx *c, char out[65])
{
	uint64_t	bits = c->bytes * 8;
	unsigned char pad = 0x80;
	unsigned char len[8];
	int			i;

	sha256_update(c, &pad, 1);
	pad = 0;
	while (c->used != 56)
		sha256_update(c, &pad, 1);
	for (i = 0; i < 8; i++)
		len[i] = (unsigned char) (bits >> (56 - 8 * i));
	sha256_update(c, len, 8);
	for (i = 0; i < 8; i++)
		snprintf(out + 8 * i, 9, "%08x", c->h[i]);
}

/* the sha256 of n bytes, as 64 hex digits */
void
sha256_buffer(const void *data, size_t n, char out[65])
{
	sha256_ctx	c;

	sha256_init(&c);
	sha256_update(&c, data, n);
	sha256_hex(&c, out);
}

/* the sha256 of a file's content; false: it cannot be read (errno) */
bool
sha256_file(const char *path, char out[65])
{
	FILE	   *f = fopen(path, "rb");
	unsigned char buf[65536];
	size_t		n;
	sha256_ctx	c;

	if (f == NULL)
		return false;
	sha256_init(&c);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		sha256_update(&c, buf, n);
	if (ferror(f))
	{
		fclose(f);
		return false;
	}
	fclose(f);
	sha256_hex(&c, out);
	return true;
}
