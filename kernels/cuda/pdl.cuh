// What a decode kernel puts at its start under LT_PDL: wait for the previous kernel, then let the
// next one launch (every thread; empty without LT_PDL).
#ifndef LT_PDL_HELPERS
#define LT_PDL_HELPERS
#ifdef LT_PDL
#define PDL_PROLOGUE() do { asm volatile("griddepcontrol.wait;" ::: "memory"); \
                            asm volatile("griddepcontrol.launch_dependents;"); } while (0)
#else
#define PDL_PROLOGUE() do { } while (0)
#endif
#endif
