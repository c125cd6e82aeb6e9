"""The contract a plugin programs against, and that everything else in rungd builds on.

``rungd.sdk`` hands these out; nothing here imports the daemon, the runner or the operating
system's facts:

    contract       Tool, ToolInputs, Description, Heading, Timing, CallContext, Result, Caller
    errors         the error codes and the exceptions that carry them
    envelope       the one result every call returns
    hookspecs      the plugin hooks
    expectations   what a read must show for an effect to count as happened
"""
