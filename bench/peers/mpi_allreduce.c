/* mpi_allreduce: the time of one MPI_Allreduce (sum) of a float32 model
 * vector, the peer-to-peer exchange that a data-parallel job would use
 * instead of a parameter server. Built and run by bench/peers.sh:
 *
 *   mpirun -np N mpi_allreduce PARAMS ITERATIONS WARMUP
 *
 * Every rank reduces PARAMS floats in place, back to back, ITERATIONS +
 * WARMUP times, and times each call; rank 0 prints one line of JSON with
 * every rank's times after the warm-up and each rank's CPU seconds (user +
 * system) over the timed calls:
 *   {"peer": "mpi", "procs": N, "params": P, "times": [[...], ...], "cpu": [...]}
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, procs = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &procs);
  if (argc != 4 || atol(argv[1]) <= 0 || atoi(argv[2]) <= 0 || atoi(argv[3]) < 0) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allreduce PARAMS ITERATIONS WARMUP\n");
    MPI_Finalize();
    return 2;
  }
  const long params = atol(argv[1]);
  const int iterations = atoi(argv[2]), warmup = atoi(argv[3]);
  float* model = malloc(sizeof(float) * params);
  double* times = malloc(sizeof(double) * iterations);
  double* all = malloc(sizeof(double) * iterations * procs);
  double* cpus = malloc(sizeof(double) * procs);
  if (!model || !times || !all || !cpus) {
    fprintf(stderr, "mpi_allreduce: out of memory for %ld parameters\n", params);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (long i = 0; i < params; i++) model[i] = 1e-6f;
  double cpu = 0;
  for (int it = -warmup; it < iterations; it++) {
    if (it == 0) cpu = cpu_seconds();
    const double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, model, (int)params, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (it >= 0) times[it] = MPI_Wtime() - start;
  }
  cpu = cpu_seconds() - cpu;
  MPI_Gather(times, iterations, MPI_DOUBLE, all, iterations, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Gather(&cpu, 1, MPI_DOUBLE, cpus, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("{\"peer\": \"mpi\", \"procs\": %d, \"params\": %ld, \"times\": [", procs, params);
    for (int r = 0; r < procs; r++) {
      printf("%s[", r ? ", " : "");
      for (int it = 0; it < iterations; it++) printf("%s%.6f", it ? ", " : "", all[r * iterations + it]);
      printf("]");
    }
    printf("], \"cpu\": [");
    for (int r = 0; r < procs; r++) printf("%s%.4f", r ? ", " : "", cpus[r]);
    printf("]}\n");
  }
  free(model); free(times); free(all); free(cpus);
  MPI_Finalize();
  return 0;
}
