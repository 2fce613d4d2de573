"""The run side: what a run does with a results directory, one room per job.

- ``batch``: a simulate job's work, ``run_batch`` (cells taken or simulated, the batch's store written);
  ``stored``: the cells a store or a killed job's checkpoints hold that can be trusted.
- ``manifest``: the record a simulate job leaves of its batch.
- ``owner``: which config owns a results directory; ``lock``: one controller at a time on it.
- ``health``: what is wrong with its batches and cells; ``summaries``: with its summaries.
- ``tickets``: the files that make Snakemake rerun a job for damage it cannot see.
- ``failures``: the failures the numbers decide, named by grid point with their remedy.
- ``jobs``: what the Snakemake workflow calls (parse time, job parameters, the jobs themselves).

Nothing is imported here: a job loads the rooms it uses, and no more.
"""
