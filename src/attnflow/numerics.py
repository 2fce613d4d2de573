"""The version of the numbers the engine computes (``attnflow.engine`` re-exports it), and the bound
on a store's accuracy certificate.

Its own module, outside the engine package: the workflow reads it at every start (a store's
record must match it), and importing anything under ``attnflow.engine`` loads numba and
compiles the dispatch checks (0.3 s of each ``snakemake`` start, measured).

Bump ``NUMERICS_VERSION`` with any change that moves a computed number (a new
step-size rule, another interpolant for ``t_cluster``, a reordered sum): every
store records the version it was written under, and a store of another version
is ``stale``, recomputed by the next ``snakemake`` and never mixed into a
summary with current ones. ``tests/test_numerics_version.py`` holds golden
values of a few cells and fails when they change while this stays the same.
"""

# A store whose accuracy certificate (docs/model.md, "Numerics": the worst of its seeds') exceeds this is
# uncertified: `attnflow status` lists it, a figure's footer says so.
CERTIFICATE_BOUND = 1e-4

# 2: scalar heads (M_h = lambda_h I, values aligned) with n < d integrate in the span of the initial
#    tokens (engine._span_basis): the same flow, its error control on n coordinates instead of d.
# 3: products above 10^6 multiply-adds with a small right operand are taken in panels of rows
#    (engine/machinery/blas.py): OpenBLAS computes them with its unpacked kernel, whose sums differ in the
#    last bit on some shapes (256 tokens in d = 17, say); the shapes of most cells keep every bit.
# 4: the accuracy certificate covers every seed (a companion run of all seeds, looser for smooth fields,
#    tighter for relu) and is stored per seed (`certificate_error` over `seed`); the default config's
#    tolerances are fitted to it (relu's stored numbers were off by up to 0.45 at rtol 1e-6).
#    Stores also keep every variable's and coordinate's units, long_name and description (CF units: "1",
#    time included), which packing a batch's cells dropped; the numbers are the same. Stores of 3 lack
#    them, so they are recomputed rather than read back without them.
#    A seed that fails (step budget, step-size underflow, non-finite values, a drift off the sphere) is
#    stored as failed with its cell instead of failing the cell: stores gain the variables failed,
#    failure and t_failed and the attrs n_seeds_failed and seed_failures; censored is False for a
#    failed seed (issue 39). The numbers of seeds that succeed are unchanged.
# 5: the certificate is honest where steps are limited by stability (issue 49): a seed whose looser
#    companion's step count did not follow its tolerance gets a tighter companion (twice the deviation); one
#    whose tighter companion's did not either, whose runs differ by more than 10% of a variable, or whose
#    companion failed, is uncertified (certificate_error NaN, and the cell's; the new per-seed
#    certificate_flag says why) instead of a number below its error. The integrated numbers are unchanged.
# 6: the capped companion (issue 49): a seed whose tighter companion's steps did not follow its tolerance
#    either gets a third, the tighter tolerance with every step at most half the seed's mean step (0.7 of it
#    since 7), and is certified by it (certificate_flag capped) instead of stored uncertified; a cell the
#    cost model expects stability to size (resources.stability_sized: config/paper.yaml's metastability
#    cells) gets the capped companion alone. Certificates move (NaN to numbers, and those cells' routes);
#    the integrated numbers are unchanged.
# 7: the capped companion caps each step at 0.7 of the seed's mean step, not 0.5 (certificate.CERTIFICATE_CAP:
#    the same certificate / true error, 1.98-2.03, for 0.71 of its cost). The certificates of capped seeds
#    move in their third digit; the integrated numbers are unchanged.
# 8: the capped companion groups seeds by their own caps (a group's run at its smallest, the seeds within
#    sqrt 2 of it) instead of by a fixed grid of caps sqrt 2 apart, which had put most seeds near 0.5 of their
#    mean step: 1.37-1.39 of the run's field evaluations, not 1.76, certificate / true error unchanged
#    (1.98-2.00). Capped seeds' certificates move in their third digit; the integrated numbers do not.
NUMERICS_VERSION = 8
# Each engine's own numbers, beside NUMERICS_VERSION (which covers what the engines share, and makes
# every store stale): a change that moves one engine's numbers only bumps its entry, and only the cells
# that engine computed are computed again. A cell records its engine's entry (``engine_numerics``); a
# cell stored before these entries existed holds version 1 of its engine.
# jax 2: observables measured in cache-sized chunks of samples on a CPU (one sample at a time from
#        bench_peers' M up, instead of up to 1 GiB of samples at once): XLA vectorises the other shapes
#        differently, which moves the last bits of the measured variables (at most 4e-15 of their size).
# numba 2: products of at most 131,072 multiply-adds by the engine's own tiles (each entry one chain of
#          fused multiply-adds, engine/machinery/tiles.py) instead of BLAS: where BLAS summed an entry in
#          another order (OpenBLAS's AVX2 kernels on some shapes, its AVX-512 ones on deep products) its
#          last bit moves.
ENGINE_NUMERICS = {"numba": 2, "jax": 2}

__all__ = ["CERTIFICATE_BOUND", "ENGINE_NUMERICS", "NUMERICS_VERSION"]
