/* Listing B.2 of the thesis: the selection sort used by both versions of the
 * distributed sort (the Leda-RS stages and the MPI peer compile this same file,
 * with the same compiler and -O2). */
#include "selection_sort.h"

void selection_sort(double *v, int n) {
  int i, j;
  for (j = 0; j < n - 1; j++) {
    int iMin = j;
    for (i = j + 1; i < n; i++) if (v[i] < v[iMin]) iMin = i;
    if (iMin != j) { double t = v[j]; v[j] = v[iMin]; v[iMin] = t; }
  }
}
