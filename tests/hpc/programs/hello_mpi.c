/* An MPI hello world that computes: each rank prints its rank, the world's size, its
 * host and the sum of all ranks (an allreduce), for the tests that start an MPI program
 * from a task through HPCSCHED_MPI_PREFIX. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, sum, len;
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &len);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("HELLO %d %d %s %d\n", rank, size, host, sum);
    MPI_Finalize();
    return 0;
}
