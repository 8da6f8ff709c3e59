"""The discrete-event simulator of the elastic scheduler (``gyre simulate``).

- ``simulator``: ``simulate``, the event loop over simulated cells, driving the
  scheduler's own policy objects (``gyre_env.scheduler.policy`` / ``peers``), so a
  simulated result is a result of the shipped code; ``rounds``: its serving model;
  ``result``: what a run measured;
- ``workload``: the episodes it replays or draws; ``config``: the TOML config;
- ``trace``: real runs (synchronous and elastic) as simulator input, fitted and validated;
- ``compare`` runs every policy on one config, ``report`` renders the comparison,
  ``cli`` is the command.
"""
