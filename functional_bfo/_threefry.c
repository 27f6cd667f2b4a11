/* Threefry-2x32 for the CPU kernels of functional_bfo.random's ops, built at install time.

   `pip install .` compiles this file into the package as functional_bfo._threefry where a C
   compiler is found; without it the ops' CPU kernel is numpy. Both are tested bit for
   bit against the tensor-op reference (tests/test_random.py). The functions are called
   through ctypes on tensors' data pointers; the module itself has no Python functions. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define BLOCK 256
#define ROTL(x, r) (((x) << (r)) | ((x) >> (32 - (r))))
#define ROUND(r) x0 += x1; x1 = ROTL(x1, r) ^ x0;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* The 20 rounds on m <= BLOCK lanes in place: the loop vectorizes. */
static inline void rounds(const uint32_t *A, const uint32_t *B, uint32_t *X0, uint32_t *X1,
                          int64_t m) {
  for (int64_t j = 0; j < m; j++) {
    uint32_t a = A[j], b = B[j], k2 = a ^ b ^ 0x1BD11BDAu;
    uint32_t x0 = X0[j] + a, x1 = X1[j] + b;
    ROUND(13) ROUND(15) ROUND(26) ROUND(6)  x0 += b;  x1 += k2 + 1u;
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k2; x1 += a + 2u;
    ROUND(13) ROUND(15) ROUND(26) ROUND(6)  x0 += a;  x1 += b + 3u;
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += b;  x1 += k2 + 4u;
    ROUND(13) ROUND(15) ROUND(26) ROUND(6)  x0 += k2; x1 += a + 5u;
    X0[j] = x0;
    X1[j] = x1;
  }
}

/* Threefry-2x32, 20 rounds (Salmon et al. 2011), on n lanes of 32-bit words held in int64.
   Each input is a scalar (stride 0) or a contiguous array of n words (stride 1). Lanes go
   through in blocks gathered into uint32 scratch. */
CLONES
void threefry2x32(const int64_t *k0, const int64_t *k1, const int64_t *c0, const int64_t *c1,
                  int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                  int64_t *y0, int64_t *y1, int64_t n) {
  uint32_t A[BLOCK], B[BLOCK], X0[BLOCK], X1[BLOCK];
  for (int64_t base = 0; base < n; base += BLOCK) {
    int64_t m = n - base < BLOCK ? n - base : BLOCK;
    for (int64_t j = 0; j < m; j++) {
      int64_t i = base + j;
      A[j] = (uint32_t)k0[i * s0];
      B[j] = (uint32_t)k1[i * s1];
      X0[j] = (uint32_t)c0[i * s2];
      X1[j] = (uint32_t)c1[i * s3];
    }
    rounds(A, B, X0, X1, m);
    for (int64_t j = 0; j < m; j++) {
      y0[base + j] = X0[j];
      y1[base + j] = X1[j];
    }
  }
}

/* The inverse normal CDF's inputs x = 2u - 1 of random.normal_rows, every step exact:
   row r of `cols` values takes the words of counters (counter, r * h + j), j < h. A float
   takes 23 bits of one word (value k < h from the first word of lane k, the rest from the
   second words); a double takes 52 bits of two (h = cols: 20 from the first word of lane k,
   32 from its second). u = (m + 0.5) 2^-bits lies in the open interval (0, 1). */
CLONES
void unit_rows(int64_t k0, int64_t k1, int64_t counter, int64_t rows, int64_t cols,
               int64_t wide, void *out) {
  uint32_t A[BLOCK], B[BLOCK], X0[BLOCK], X1[BLOCK];
  int64_t h = wide ? cols : (cols + 1) / 2, n = rows * h;
  for (int64_t j = 0; j < BLOCK; j++) {
    A[j] = (uint32_t)k0;
    B[j] = (uint32_t)k1;
  }
  int64_t r = 0, k = 0; /* the row and place in it of the next lane written out */
  for (int64_t base = 0; base < n; base += BLOCK) {
    int64_t m = n - base < BLOCK ? n - base : BLOCK;
    for (int64_t j = 0; j < m; j++) {
      X0[j] = (uint32_t)counter;
      X1[j] = (uint32_t)(base + j);
    }
    rounds(A, B, X0, X1, m);
    for (int64_t j = 0; j < m; j++) {
      if (wide) {
        uint64_t bits = ((uint64_t)(X0[j] >> 12) << 32) | X1[j];
        ((double *)out)[r * cols + k] = 2.0 * (((double)bits + 0.5) * 0x1p-52) - 1.0;
      } else {
        float *row = (float *)out + r * cols;
        row[k] = 2.0f * (((float)(X0[j] >> 9) + 0.5f) * 0x1p-23f) - 1.0f;
        if (h + k < cols) row[h + k] = 2.0f * (((float)(X1[j] >> 9) + 0.5f) * 0x1p-23f) - 1.0f;
      }
      if (++k == h) {
        k = 0;
        r++;
      }
    }
  }
}

static struct PyModuleDef threefry_module = {
    PyModuleDef_HEAD_INIT, "_threefry",
    "Threefry-2x32 CPU kernels for functional_bfo.random, called through ctypes.", -1, NULL};

PyMODINIT_FUNC PyInit__threefry(void) { return PyModule_Create(&threefry_module); }
