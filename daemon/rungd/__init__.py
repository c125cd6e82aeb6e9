"""rungd: a daemon that lets agent code operate legacy programs through task-shaped tools.

The public pieces for plugin authors are ``rungd.core.contract`` (declaring tools),
``rungd.runner`` (running a command-line program), ``rungd.core.hookspecs`` (the hooks) and
``rungd.testing`` (fixtures); for agent code, ``rungd.client``.
"""

__version__ = "0.1.0"
