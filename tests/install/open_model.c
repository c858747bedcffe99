/* A learner program outside the tree, built only from an installed blkps:
 *   cc open_model.c $(pkg-config --cflags --libs blkps)
 * or through find_package(blkps) (CMakeLists.txt beside it).
 *
 * Usage: open_model TARGET PARAMS
 * Opens the model at TARGET (a server with rule=sgd, lr=1 and zero weights),
 * pushes the gradient g[i] = i % 5 + 1 for PARAMS parameters, pulls them
 * back and checks w == -g. Prints "open_model: ok" and exits 0, or one line
 * saying what differed and exits 1. */
#include <stdio.h>
#include <stdlib.h>

#include <blkps/blkps.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: open_model TARGET PARAMS\n");
    return 2;
  }
  const uint64_t n = strtoull(argv[2], NULL, 10);
  char err[256];
  blkps_model *m;
  if (blkps_open(argv[1], NULL, &m, err, sizeof err) != 0) {
    fprintf(stderr, "open_model: %s\n", err);
    return 1;
  }
  float *grad = malloc(n * sizeof *grad);
  float *weights = malloc(n * sizeof *weights);
  int rc = 1;
  if (grad == NULL || weights == NULL) {
    fprintf(stderr, "open_model: out of memory\n");
    goto out;
  }
  for (uint64_t i = 0; i < n; ++i) grad[i] = (float)(i % 5 + 1);
  if (blkps_push(m, 0, grad, n) != 0 || blkps_pull(m, 0, weights, n) != 0) {
    fprintf(stderr, "open_model: %s\n", blkps_last_error(m));
    goto out;
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (weights[i] != -grad[i]) {
      fprintf(stderr, "open_model: weight %llu is %g, expected %g\n", (unsigned long long)i, weights[i], -grad[i]);
      goto out;
    }
  }
  printf("open_model: ok\n");
  rc = 0;
out:
  free(grad);
  free(weights);
  blkps_close(m);
  return rc;
}
