/* The MPI peer of the Leda-RS distributed sort (thesis Listing B.3, adapted so that
 * both versions do the same work; see examples/sort/bench.sh).
 *
 *   mpirun -np P+1 sort_mpi sort LENGTH    -> "mpi LENGTH P PART SECONDS"
 *   mpirun -np 2   sort_mpi send BYTES R W -> "send BYTES SECONDS"
 *
 * sort: rank 0 plays scatter and reducer; ranks 1..P each sort LENGTH/P doubles with
 * Listing B.2 (the same selection_sort.c as the Leda-RS stages, same -O2) and send
 * them back; rank 0 does not sort (as in B.3). MPI_Scatter gives every rank,
 * the root included, one segment: the root's segment is a placeholder, so each
 * worker gets exactly the part a Leda-RS sort stage gets. The input is the same as
 * Leda-RS's: LENGTH, LENGTH-1, ..., 1 (reverse-sorted). The clock runs from after
 * filling the vector (before MPI_Scatter) to the last MPI_Recv, as in Leda-RS.
 *
 * send: rank 0 sends BYTES bytes to rank 1, which answers with an 8-byte
 * acknowledgement; W warm-up rounds, then the median of R rounds is printed.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "selection_sort.h"

static double now(void) {
  struct timeval t;
  gettimeofday(&t, NULL);
  return t.tv_sec + t.tv_usec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int sort_main(int rank, int np, long length) {
  int p = np - 1; /* sorting ranks */
  if (p < 1 || length % p != 0) {
    if (rank == 0) fprintf(stderr, "sort: need P >= 1 workers dividing LENGTH\n");
    return 2;
  }
  int part = (int)(length / p);
  double *all = NULL, *mine = malloc(sizeof(double) * part);
  if (rank == 0) {
    /* Segment 0 is the root's placeholder; segment k (1..P) is part k-1. */
    all = malloc(sizeof(double) * (size_t)part * np);
    for (long i = 0; i < length; i++) all[part + i] = (double)(length - i);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now();
  MPI_Scatter(all, part, MPI_DOUBLE, mine, part, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank != 0) {
    selection_sort(mine, part);
    MPI_Send(mine, part, MPI_DOUBLE, 0, 1, MPI_COMM_WORLD);
  } else {
    for (int k = 1; k < np; k++)
      MPI_Recv(all + (size_t)part * k, part, MPI_DOUBLE, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
    double secs = now() - t0;
    /* Outside the window: the parts, in order, must be 1..LENGTH. */
    qsort(all + part, (size_t)length, sizeof(double), cmp_double);
    int ok = 1;
    for (long i = 0; i < length; i++) ok &= all[part + i] == (double)(i + 1);
    printf("mpi %ld %d %d %.6f\n", length, p, part, secs);
    if (!ok) {
      fprintf(stderr, "sort: result is not the whole input in order\n");
      return 1;
    }
  }
  free(all);
  free(mine);
  return 0;
}

static int send_main(int rank, long bytes, int rounds, int warmup) {
  char *buf = malloc(bytes > 0 ? bytes : 1);
  memset(buf, 0x5a, bytes);
  double *times = malloc(sizeof(double) * (rounds > 0 ? rounds : 1));
  long ack = 0;
  for (int r = 0; r < warmup + rounds; r++) {
    if (rank == 0) {
      double t0 = now();
      MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 2, MPI_COMM_WORLD);
      MPI_Recv(&ack, 1, MPI_LONG, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (ack != bytes) {
        fprintf(stderr, "send: acknowledged %ld of %ld bytes\n", ack, bytes);
        return 1;
      }
      if (r >= warmup) times[r - warmup] = now() - t0;
    } else if (rank == 1) {
      MPI_Status st;
      int got = 0;
      MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &st);
      MPI_Get_count(&st, MPI_BYTE, &got);
      ack = got;
      MPI_Send(&ack, 1, MPI_LONG, 0, 3, MPI_COMM_WORLD);
    }
  }
  if (rank == 0) {
    qsort(times, rounds, sizeof(double), cmp_double);
    printf("send %ld %.6f\n", bytes, times[rounds / 2]);
  }
  free(buf);
  free(times);
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, np, rc = 2;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  if (argc >= 3 && strcmp(argv[1], "sort") == 0) {
    rc = sort_main(rank, np, atol(argv[2]));
  } else if (argc >= 5 && strcmp(argv[1], "send") == 0 && np >= 2) {
    rc = send_main(rank, atol(argv[2]), atoi(argv[3]), atoi(argv[4]));
  } else if (rank == 0) {
    fprintf(stderr, "usage: sort_mpi sort LENGTH | sort_mpi send BYTES ROUNDS WARMUP\n");
  }
  MPI_Finalize();
  return rc;
}
