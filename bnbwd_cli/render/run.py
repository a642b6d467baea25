"""What `bnbwd run` shows a person: the progress bar (the summary table follows in the next step)."""

from __future__ import annotations


def progress_bar(console):  # noqa: ANN001 - a rich Console
    """A transient rich progress bar on `console` and the callback (done, total) that moves it."""
    from rich.progress import BarColumn, Progress, TimeRemainingColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), "{task.percentage:>3.0f}%",
                   TimeRemainingColumn(), console=console, transient=True)
    task = bar.add_task("backward", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update
