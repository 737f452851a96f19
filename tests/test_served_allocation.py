"""The engine's guess rows a step (speculative/served.py allocate): a row goes to a slot
only where it shortens the predicted time to the last slot's end, so a slot that guesses
nothing is not slowed by the others' rows, and every slot guesses where all copy."""

from edgellm.speculative.served import SpecChain, StepCosts, allocate, makespan


def linear(rows: int) -> float:  # a 4-row step ~1.7x a 1-row one, as the batched step
    return 1.0 + 0.23 * (rows - 1)


def test_every_slot_guesses_where_all_copy():
    accept = [0.9] * 4
    k = allocate(accept, [7] * 4, [200] * 4, 0, linear)
    assert all(x >= 1 for x in k)
    assert makespan(accept, k, [200] * 4, 0, linear) < \
        0.8 * makespan(accept, [0] * 4, [200] * 4, 0, linear)


def test_a_slot_that_guesses_nothing_is_not_slowed():
    # the three copying slots' rows would slow the fourth, which ends last either way
    assert allocate([0.9, 0.9, 0.9, 0.05], [7] * 4, [200] * 4, 0, linear) == [0] * 4
    # one guessing slot beside three plain rows: its rows would slow theirs
    assert allocate([0.9], [7], [200], 3, linear) == [0]


def test_alone_it_guesses_as_far_as_it_pays():
    assert allocate([0.9], [7], [200], 0, linear) == [5]
    assert allocate([0.9], [2], [200], 0, linear) == [2]  # no more than it may guess
    assert allocate([0.15], [7], [200], 0, linear) == [0]


def test_step_costs_trust_a_count_after_a_few_steps():
    costs = StepCosts()
    for _ in range(10):
        costs.timed(4, 0.010)
    costs.timed(8, 0.5)  # first of its count: left out
    costs.timed(8, 0.05)  # a probe's: not trusted yet
    assert abs(costs(8) - 0.010 * (1 + 0.25 * 7) / (1 + 0.25 * 3)) < 1e-9
    for _ in range(15):
        costs.timed(8, 0.012)
    assert costs(8) < 0.02


class _Spec:
    proposed = accepted = 0


def test_acceptance_learned_from_guesses_not_run():
    chain = SpecChain(None, [1, 2, 3, 1, 2, 3, 1, 2], None, (), True, _Spec())
    chain.guesses = [3, 1, 2]
    chain.shadow = (len(chain.history), list(chain.guesses))
    before = chain.acceptance
    chain.history += [3, 1, 2]  # what came: all three taken, none verified
    chain._score()
    assert chain.shadow is None and chain.acceptance > before
