
// matvec_cuda's `matvec_rows` (matvec_rows_body: same grid, a CTA of 128 threads per RR rows; P = 1 prefetches the
// next trip's weights, P = 2 spreads a row's last half trip: matvec_rows_partials) with the tables' fill first (`matvec_rows` has no T::init). RR, not R: matvec_iq.py
// #defines R.
template <class T, int N, int RR, int P>
__global__ void __launch_bounds__(128) matvec_with_init(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                              float* __restrict__ out, int rows, int cols) {
    T::init();
    matvec_rows_body<T, N, RR, P>(w, x, out, rows, cols);
}
