"""`rlaccel bench`: stock vs rlaccel in the same run, interleaved, several seeds.

``suites`` says what runs, ``runner`` runs it (each training in a fresh process, so peak memory and
torch state are per run), ``report`` turns the records into ``results.json``, a Markdown table and plots.
"""
