"""The errors every layer raises, in a module that imports nothing of attnflow's.

``ConfigError`` is raised by config loading, sweep expansion, the experiments'
own checks, ``refine`` and the access API alike; defined here, below all of
them, it ties none of them to another (it used to live in ``experiments``).
"""


class ConfigError(ValueError):
    """A sweep config that cannot run; the message names the key and value."""


__all__ = ["ConfigError"]
