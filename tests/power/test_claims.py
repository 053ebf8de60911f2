"""One measurement per source at a time: a second claim on a held source is told who holds it,
and the claim ends with its process, however it ends."""

import subprocess
import sys
import textwrap
import uuid

from openjarvis.power.claims import claim_sources


def _hold_in_child(name: str) -> subprocess.Popen[str]:
    """Another process that claims `name` and keeps it until killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from openjarvis.power.claims import claim_sources
        claim = claim_sources([{name!r}], "a test holder")
        print("held" if claim.held else "taken", flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_held_source_is_reported_with_its_holder_and_freed_when_the_holder_dies() -> None:
    name = f"test:{uuid.uuid4().hex}"
    child = _hold_in_child(name)
    try:
        second = claim_sources([name, f"{name}-other"], "the second")
        assert second.taken == {name: f"pid {child.pid}: a test holder"}
        assert second.held == [f"{name}-other"]
        second.release()
    finally:
        child.kill()
        child.wait()
    third = claim_sources([name], "the third")
    assert third.held == [name] and not third.shared  # SIGKILL dropped the lock
    third.release()
