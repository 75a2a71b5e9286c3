"""Analyses: the measurements and models that rules, report sections and the rank planner share.

A rule reads an analysis; an analysis never reads a rule. Each module here answers one question over the
derived tables (serving series, kernel phases, tensor-parallel collectives, rank skew, all-reduce fits,
topology) so that more than one caller can ask it without importing another caller.
"""
