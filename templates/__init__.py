"""Kernel templates: the epilogue IR and its rule table, Problem/Config, and the
render -> build -> launch path of each Jinja template of a Triton kernel."""
