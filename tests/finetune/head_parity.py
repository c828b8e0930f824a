"""The check that a task head of ours trains like transformers' task model given the same weights."""
import torch


def assert_trains_like(ours, theirs, batch: dict, targets: dict, head: str) -> None:
    """In training mode (dropout on) from the same random state, ``ours`` gives ``theirs``' logits and loss, for a
    ``head`` of "sequence", "token" or "span" (the span head's loss is not compared)."""
    ours.train()
    theirs.train()
    torch.manual_seed(11)
    loss, logits = ours(**batch, **targets)
    torch.manual_seed(11)
    out = theirs(**batch, **targets)
    real = batch["attention_mask"].bool()
    if head == "span":  # ours sets padding's logits to -1e4 (never an answer), so compare real positions and no loss
        torch.testing.assert_close(logits[0][real], out.start_logits[real], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(logits[1][real], out.end_logits[real], rtol=1e-4, atol=1e-5)
    else:
        got, expected = (logits[real], out.logits[real]) if head == "token" else (logits, out.logits)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(loss, out.loss, rtol=1e-4, atol=1e-6)
