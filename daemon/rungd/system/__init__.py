"""Facts of the operating system rungd decides by: process trees and cgroups (proctree),
who owns a file and every folder above it (trust), and systemd's notify socket (sdnotify).
Nothing here knows of tools or calls."""
