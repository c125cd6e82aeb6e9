"""What plugin authors and agent developers use beside the daemon: ``rungctl lint`` (lint),
``rungctl check`` with its stand-in programs (check, standins), ``rungctl eval`` (evalharness),
``rungctl new-plugin`` (scaffold, templates/) and tool definitions in each model provider's
shape (definitions)."""
