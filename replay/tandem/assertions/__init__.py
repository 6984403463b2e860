"""Temporal kernel assertions (ThinTESLA-style) checked from the hypervisor on replay.

Data flow: lang.parse_file (assertion text -> an AssertionSet; needed() and sites()
name what to instrument) -> plugin event source (a TCG plugin on an exact replay
emits call/return events for those symbols only, decoded by events.py) ->
automata.Checker (one automaton instance per thread or global, ThinTESLA
semantics) -> violations. docs/assertions.md describes the language and semantics.
"""
