"""Integrations of fx100io with other projects (LMCache, ...).

Each submodule imports its host project only when it is itself imported, so
`import fx100io` never needs LMCache installed.
"""
