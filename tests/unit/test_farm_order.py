"""The order a night hands its tasks out in (farm/night.longest_first): analyses first,
then exact replays, each the longest recording first, so no worker is left with one long
replay at the night's end."""
from __future__ import annotations

from tandem.farm import task
from tandem.farm.night import Corpus, Target, longest_first, plan
from tandem.farm.store import CONFIRM, TaskKey


def test_analyses_then_exact_replays_each_longest_recording_first():
    corpus = [Corpus("/b/short", "s", icount=4_800_000_000), Corpus("/b/long", "l", icount=5_600_000_000),
              Corpus("/b/mid", "m", icount=5_500_000_000), Corpus("/b/unknown", "u")]
    tasks = [(i, key) for i, (key, _) in enumerate(plan(corpus, [Target("kasan", "k")], "q"), 1)]
    tasks.append((len(tasks) + 1, TaskKey("/runs/kasan-recording", "r", task.EXACT, CONFIRM)))
    order = [(key.analysis, key.bundle) for _, key in longest_first(tasks, {c.bundle: c.icount for c in corpus})]
    assert order == [("kasan", "/b/long"), ("kasan", "/b/mid"), ("kasan", "/b/short"), ("kasan", "/b/unknown"),
                     (task.EXACT, "/b/long"), (task.EXACT, "/b/mid"), (task.EXACT, "/b/short"),
                     (task.EXACT, "/b/unknown"), (task.EXACT, "/runs/kasan-recording")]


def test_without_lengths_the_order_given_is_kept_analyses_first():
    keys = [TaskKey(f"/b/{n}", n, a) for n in "xyz" for a in (task.EXACT, "lockdep")]
    order = [key for _, key in longest_first(enumerate(keys), {})]
    assert order == [k for k in keys if k.analysis == "lockdep"] + [k for k in keys if k.analysis == task.EXACT]
