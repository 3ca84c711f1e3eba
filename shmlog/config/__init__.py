"""A broker's settings: its TOML file and flags, the ``[cluster]`` table, CurveZMQ
key files, and the configuration reference generated from them. Imports common and
storage's topic configs.
"""
