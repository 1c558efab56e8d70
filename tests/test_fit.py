"""Whether a cluster can ever hold a job's actors (``dlrover.resource.fit``): pure logic
over node totals, checked before launching."""

from __future__ import annotations

from dlrover.resource.fit import Demand, Node, pack

QUICKSTART = [Demand("worker", 1, 0, 2048)] * 2 + [Demand("PS", 1, 0, 1024)] * 2 + [Demand("dense PS", 0.25)]


def test_a_job_needing_more_cpus_than_the_cluster_has_is_impossible_and_says_how_many():
    fit = pack(QUICKSTART, [Node(4, 0, 16384)])
    assert fit.impossible
    assert fit.shortfall() == "2 workers x 1 CPU + 2 PS x 1 CPU + 1 dense PS x 0.25 CPUs need 4.25 CPUs; the cluster has 4 CPUs on 1 node"


def test_a_job_that_fits_leaves_nothing_unplaced():
    fit = pack(QUICKSTART, [Node(4.25, 0, 16384)])
    assert not fit.unplaced and not fit.impossible


def test_an_actor_larger_than_every_node_is_named_with_the_largest_node():
    fit = pack([Demand("worker", 8)], [Node(4), Node(6)])
    assert fit.impossible and fit.shortfall() == "a worker asks for 8 CPUs and the largest node has 6 CPUs"
    fit = pack([Demand("worker", 1, 1)], [Node(4)])
    assert fit.impossible and fit.shortfall() == "a worker asks for 1 GPU and the largest node has 0 GPUs"


def test_memory_is_counted_like_cpus():
    fit = pack([Demand("worker", 1, 0, 4096)] * 2, [Node(4, 0, 6144)])
    assert fit.impossible and fit.shortfall() == "2 workers x 4.0 GiB of memory need 8.0 GiB of memory; the cluster has 6.0 GiB of memory on 1 node"


def test_actors_that_only_a_better_packing_could_place_are_left_to_ray():
    # Largest first on two 10-CPU nodes: 5+4 and 4+3+2 leave one CPU on each for the last
    # 2, though 5+3+2 and 4+4+2 fit; the greedy packing is no proof the job cannot run.
    fit = pack([Demand("worker", c) for c in (5, 4, 4, 3, 2, 2)], [Node(10), Node(10)])
    assert fit.unplaced and not fit.impossible
    fit = pack([Demand("worker", 3)] * 2, [Node(4), Node(2)])
    assert fit.unplaced and not fit.impossible and fit.shortfall() == "2 workers x 3 CPUs do not pack into the 6 CPUs of 2 nodes"


def test_the_largest_actors_are_placed_first():
    fit = pack([Demand("PS", 1), Demand("worker", 3)], [Node(3), Node(1)])
    assert not fit.unplaced  # the 3-CPU worker takes the 3-CPU node before the PS could
