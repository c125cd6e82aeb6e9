"""Built-in rungd plugins. Each is registered through the ``rungd.plugins`` entry point
group, exactly as a third-party plugin would be."""
