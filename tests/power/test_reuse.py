"""Pricing the prefill a cached prefix saved: by the latest prefill that computed enough prompt
tokens to be a fair price; unknown (None) before one, or when the engine did not say."""

from openjarvis.power.reuse import MIN_PRICED_TOKENS, PrefillPrice


def test_unknown_until_a_cold_prefill_prices_a_token() -> None:
    price = PrefillPrice()
    assert price.saved_j(900) is None
    price.observe(prompt_tokens=1000, cached_tokens=0, prefill_j=20.0)
    assert price.saved_j(900) == 900 * 0.02
    assert price.saved_j(0) == 0.0  # nothing reused: a known zero
    assert price.saved_j(None) is None  # the engine did not say


def test_a_mostly_cached_prefill_does_not_set_the_price() -> None:
    price = PrefillPrice()
    price.observe(prompt_tokens=1000, cached_tokens=0, prefill_j=20.0)
    # 8 computed tokens cost about one pass over the weights: far above 0.02 J each.
    price.observe(prompt_tokens=1008, cached_tokens=1000, prefill_j=1.0)
    assert price.saved_j(100) == 100 * 0.02
    price.observe(prompt_tokens=MIN_PRICED_TOKENS, cached_tokens=0, prefill_j=3.2)
    assert price.saved_j(100) == 100 * 3.2 / MIN_PRICED_TOKENS


def test_unknown_energy_or_reuse_leaves_the_price_and_forget_drops_it() -> None:
    price = PrefillPrice()
    price.observe(prompt_tokens=500, cached_tokens=None, prefill_j=5.0)
    price.observe(prompt_tokens=500, cached_tokens=0, prefill_j=None)
    assert price.saved_j(10) is None
    price.observe(prompt_tokens=500, cached_tokens=0, prefill_j=5.0)
    price.forget()
    assert price.saved_j(10) is None
