"""Temporal kernel assertions (ThinTESLA-style) checked from the hypervisor on replay.

Data flow: lang.parse (assertion text -> automata descriptions and the symbols they
need) -> plugin event source (a TCG plugin on an exact replay emits call/return
events for those symbols only, decoded by events.py) -> automata.Checker (one
automaton instance per thread or global, ThinTESLA semantics) -> violations.
"""
