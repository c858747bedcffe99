/* mpi_allreduce: the time of one MPI_Allreduce (sum) of a float32 model
 * vector, the peer-to-peer exchange that a data-parallel job would use
 * instead of a parameter server. Built and run by bench/peers.sh:
 *
 *   mpirun -np N mpi_allreduce PARAMS ITERATIONS WARMUP [float32|bfloat16]
 *
 * Every rank reduces PARAMS values in place (float32, or bfloat16: OpenMPI
 * 4.1 has no 16-bit floating type, so a 2-byte MPI type with a commutative
 * user-defined sum that adds in float32 and rounds to nearest even), back to back, ITERATIONS +
 * WARMUP times, and times each call; rank 0 prints one line of JSON with
 * every rank's times after the warm-up and each rank's CPU seconds (user +
 * system) over the timed calls:
 *   {"peer": "mpi", "procs": N, "params": P, "dtype": D, "times": [[...], ...],
 *    "cpu": [...]}
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

static float bf16_to_float(unsigned short b) {
  unsigned int u = (unsigned int)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static unsigned short float_to_bf16(float f) { /* round to nearest even */
  unsigned int u;
  memcpy(&u, &f, sizeof u);
  return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* MPI_User_function: inout[i] += in[i], for bfloat16 values. */
static void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* type) {
  (void)type;
  const unsigned short* a = in;
  unsigned short* b = inout;
  for (int i = 0; i < *len; i++) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, procs = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &procs);
  const char* dtype = argc == 5 ? argv[4] : "float32";
  const int bf16 = strcmp(dtype, "bfloat16") == 0;
  if (argc < 4 || argc > 5 || atol(argv[1]) <= 0 || atoi(argv[2]) <= 0 || atoi(argv[3]) < 0 ||
      (!bf16 && strcmp(dtype, "float32") != 0)) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allreduce PARAMS ITERATIONS WARMUP [float32|bfloat16]\n");
    MPI_Finalize();
    return 2;
  }
  const long params = atol(argv[1]);
  const int iterations = atoi(argv[2]), warmup = atoi(argv[3]);
  MPI_Datatype type = MPI_FLOAT;
  MPI_Op op = MPI_SUM;
  if (bf16) {
    MPI_Type_contiguous(2, MPI_BYTE, &type);
    MPI_Type_commit(&type);
    MPI_Op_create(bf16_sum, 1, &op);
  }
  const size_t value_bytes = bf16 ? 2 : sizeof(float);
  void* model = malloc(value_bytes * params);
  double* times = malloc(sizeof(double) * iterations);
  double* all = malloc(sizeof(double) * iterations * procs);
  double* cpus = malloc(sizeof(double) * procs);
  if (!model || !times || !all || !cpus) {
    fprintf(stderr, "mpi_allreduce: out of memory for %ld parameters\n", params);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (long i = 0; i < params; i++) {
    if (bf16) ((unsigned short*)model)[i] = float_to_bf16(1e-6f);
    else ((float*)model)[i] = 1e-6f;
  }
  double cpu = 0;
  for (int it = -warmup; it < iterations; it++) {
    if (it == 0) cpu = cpu_seconds();
    const double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, model, (int)params, type, op, MPI_COMM_WORLD);
    if (it >= 0) times[it] = MPI_Wtime() - start;
  }
  cpu = cpu_seconds() - cpu;
  MPI_Gather(times, iterations, MPI_DOUBLE, all, iterations, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Gather(&cpu, 1, MPI_DOUBLE, cpus, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("{\"peer\": \"mpi\", \"procs\": %d, \"params\": %ld, \"dtype\": \"%s\", \"times\": [", procs, params, dtype);
    for (int r = 0; r < procs; r++) {
      printf("%s[", r ? ", " : "");
      for (int it = 0; it < iterations; it++) printf("%s%.6f", it ? ", " : "", all[r * iterations + it]);
      printf("]");
    }
    printf("], \"cpu\": [");
    for (int r = 0; r < procs; r++) printf("%s%.4f", r ? ", " : "", cpus[r]);
    printf("]}\n");
  }
  free(model);
  free(times);
  free(all);
  free(cpus);
  if (bf16) {
    MPI_Op_free(&op);
    MPI_Type_free(&type);
  }
  MPI_Finalize();
  return 0;
}
