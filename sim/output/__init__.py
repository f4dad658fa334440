"""What a simulated step looks like to a person: ``report`` (text and JSON summary), ``trace``
(Chrome trace JSON for Perfetto) and ``timeline`` (matplotlib timeline). Imports ``sim.replay``.
"""
