/* The parameters of grad_stats_kernel.cu's kernels, shared with the host code that launches
   them (grad_stats_kernel.cpp): plain C, the same layout on both sides. */
#ifndef AMPKIT_GRAD_STATS_KERNEL_ABI_H
#define AMPKIT_GRAD_STATS_KERNEL_ABI_H

#define AMPKIT_STATS_THREADS 256
#define AMPKIT_STATS_CHUNK_ELEMENTS 65536 /* one block's elements at most */

typedef struct {
  unsigned long long address; /* the chunk's first element */
  long long elements;         /* at most AMPKIT_STATS_CHUNK_ELEMENTS */
} ampkit_stats_chunk;

/* A kernel's parameters: the chunk table of one dtype's gradients, in device memory (copied
   there with the step's other inputs), and out, [chunks, 4] float64: sum of squares, max-abs,
   zeros, NaNs of each chunk. One block per chunk. */

#endif
