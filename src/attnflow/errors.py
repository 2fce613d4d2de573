"""The errors every layer raises, in a module that imports nothing of attnflow's.

``ConfigError`` is raised for a config's content by ``attnflow.config`` alone (which
evaluates what the experiments declare they need), and for the arguments of a call
on a valid config by the access API (``open_summary``, ``open_cells``) and
``attnflow refine``; ``tests/test_validation.py`` keeps that list. Defined here, below
all of them, it ties none of them to another (it used to live in ``experiments``).
"""


class ConfigError(ValueError):
    """A sweep config that cannot run, or a request it cannot answer; the message names the key and value."""


__all__ = ["ConfigError"]
