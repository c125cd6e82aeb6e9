"""A plugin with a typo in its hook name: start-up must fail and say so."""

from rungd.sdk import hookimpl


@hookimpl
def rungd_register_tool(register):  # the hook is rungd_register_tools
    pass
