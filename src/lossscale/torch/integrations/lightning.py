"""Lightning: :class:`LossScaleMonitor`, a callback that logs the loss scale and the skipped steps::

    trainer = Trainer(plugins=[MixedPrecision("16-mixed", "cuda", scaler=GradScaler("cuda"))],
                      callbacks=[LossScaleMonitor()], logger=CSVLogger("logs"))
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # pragma: no cover - the standalone package
    try:
        from pytorch_lightning import Callback, LightningModule, Trainer
    except ImportError as error:
        raise ImportError("lossscale.torch.integrations.lightning needs Lightning: pip install lightning") from error

from .._gradscaler import GradScaler
from .._optimizer import LossScaleOptimizer

__all__ = ["LossScaleMonitor"]


class LossScaleMonitor(Callback):
    """Logs ``{prefix}loss_scale`` and ``{prefix}skipped_steps`` after every optimizer step, to the Trainer's loggers.

    Sources: the precision plugin's ``lossscale.torch.GradScaler`` and every ``LossScaleOptimizer``; several get a
    suffix (``loss_scale/optimizer_1``). 0-d tensors, no host sync of its own. With ``stats_every=N`` it also logs
    the latest sample's ``headroom_bits``, ``zero_fraction`` and ``subnormal_fraction``.

    Args:
        prefix: the metric name prefix (default ``"lossscale/"``).
        prog_bar: also show the scale in the progress bar.

    Raises RuntimeError when training starts with no lossscale GradScaler or ``LossScaleOptimizer`` to read.
    """

    def __init__(self, prefix: str = "lossscale/", prog_bar: bool = False) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}.")
        self.prefix = prefix
        self.prog_bar = bool(prog_bar)
        self._sources: list[tuple[str, Any]] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sources: list[Any] = []
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if isinstance(scaler, GradScaler) and scaler.is_enabled():
            sources.append(scaler)
        sources.extend(opt for opt in trainer.optimizers if isinstance(opt, LossScaleOptimizer))
        if not sources:
            raise RuntimeError("LossScaleMonitor found no lossscale loss scale to log. Train with "
                               "plugins=[MixedPrecision('16-mixed', device, "
                               "scaler=lossscale.torch.GradScaler(device))], or return a "
                               "lossscale.torch.LossScaleOptimizer from configure_optimizers (precision plugin "
                               f"scaler: {type(scaler).__name__}).")
        self._sources = [("" if len(sources) == 1 else f"/optimizer_{i}", source) for i, source in enumerate(sources)]

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        for suffix, source in self._sources:
            values = {"loss_scale": source.loss_scale, "skipped_steps": source.skipped_steps.float()}
            stats = getattr(source, "gradient_stats", None)  # stats_every=N: the latest sample, 0-d tensors
            if stats is not None:
                values.update({k: stats[k] for k in ("headroom_bits", "zero_fraction", "subnormal_fraction")})
            for name, value in values.items():
                pl_module.log(f"{self.prefix}{name}{suffix}", value, on_step=True, on_epoch=False, batch_size=1,
                              prog_bar=self.prog_bar and name == "loss_scale", logger=True)
