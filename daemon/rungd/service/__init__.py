"""The daemon: what serves the socket and keeps the record, around the engine and the runner.

    daemon         Daemon: start-up, serving, reload, shutdown
    server         the socket: frames, peers, one handler per request
    engine/        one call from request to envelope (its own docstring draws the pipeline)
    plugins        the plugin manager: loading plugins and collecting their tools
    gates          who may approve, and how a call is held
    audit          the ledger's daemon side; ledger_upkeep: anchors and retention
    journal        logging to the systemd journal natively
    evidence       evidence files: slices for those who may see them, pruning
    credentials    the credential store handlers read from
    sensitive      the keyed marks that stand for sensitive inputs
    stepdown       step-down observations over the ledger
    catalog        tools as a caller sees them; health: what the ledger says per tool
    preflight      whether ``rungd serve`` can use the config's paths
"""
