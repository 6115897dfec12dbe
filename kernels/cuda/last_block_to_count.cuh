// Is this block the last of the `active` blocks counting on *counter to finish? Called by every
// thread once the block's partials are written (threadFenceReduction pattern: the fence makes them
// visible before the block counts); the last block resets the counter for the next launch, and its
// fence after the count orders its reads of the others' partials. (The decode attention kernels,
// kernels/matvec_epilogue.py.)
__device__ __forceinline__ bool last_block_to_count(int* counter, int active) {
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int ticket = atomicAdd(counter, 1);
        is_last = ticket == active - 1;
        if (is_last) *counter = 0;                 // every block has counted: ready for the next launch
    }
    __syncthreads();
    if (!is_last) return false;
    __threadfence();
    return true;
}
// The split blocks of one column (decode attention) count on counters[blockIdx.x].
__device__ __forceinline__ bool dec_last_of_column(int* counters, int active) {
    return last_block_to_count(counters + blockIdx.x, active);
}
