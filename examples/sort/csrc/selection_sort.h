#ifndef LEDA_SELECTION_SORT_H
#define LEDA_SELECTION_SORT_H
/* Sorts v[0..n) ascending, in place (Listing B.2). */
void selection_sort(double *v, int n);
#endif
