"""ampkit in Lightning: one plugin for ``lightning.Trainer`` and one for ``lightning.Fabric``.

Trainer::

    trainer = lightning.Trainer(plugins=[ampkit.lightning.AmpkitPrecision("cuda", nan_policy="skip")])

Fabric::

    fabric = lightning.Fabric(plugins=ampkit.lightning.fabric_plugins("cuda", clipper="norm"))

Both are Lightning's own ``MixedPrecision`` (float16 autocast, ``scale``/``unscale_``/``step``/
``update`` in Lightning's order) with an :class:`ampkit.GradScaler` as the scaler. Clipping:
``Trainer(gradient_clip_val=...)`` configures ampkit's ``norm`` clipper unless ``clipper=`` is
given (then it is refused); ``fabric.clip_gradients`` is refused (Fabric's precision plugin never
sees its threshold: name the clipper instead). docs/python.md, "Your trainer".
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
from lightning.fabric.plugins.precision.amp import MixedPrecision as FabricMixedPrecision
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch.optim import Optimizer

from ._arguments import check_arguments, check_types
from ._trainers import NO_LIMIT, make_scaler, say_state_missing, warn_fp16_on_cpu
from .grad_scaler import GradScaler

__all__ = ["AmpkitCheckpointIO", "AmpkitFabricPrecision", "AmpkitPrecision", "fabric_plugins"]

_PRECISION = "ampkit.lightning.AmpkitPrecision"
# Where Lightning checkpoints before 1.6 kept torch's scaler state (loaded by Lightning itself).
_OLD_KEY = "native_amp_scaling_state"
_LIGHTNING_ON_CPU = "Lightning's own precision='16-mixed' would have switched to 'bf16-mixed'"


def _threshold(max_norm: float) -> str:
    return "no limit" if max_norm == NO_LIMIT else f"{max_norm:g}"


class AmpkitPrecision(MixedPrecision):
    """``lightning.Trainer``'s ``16-mixed`` precision with :class:`ampkit.GradScaler` as its scaler.

    Its state (the scaler's ``state_dict``, the plugins' states under ``"ampkit"``) is saved in
    the Trainer's checkpoints under ``"AmpkitPrecision"`` and restored on resume, as Lightning
    does for every precision plugin.

    ``Trainer(gradient_clip_val=v)`` (algorithm ``"norm"``) sets ampkit's ``norm`` clipper to
    ``max_norm=v``: the gradients are clipped inside ``unscale_``, in the unscale's multiply, so
    ``on_before_optimizer_step`` sees them unscaled *and* clipped (a fused optimizer's: still
    scaled, it unscales and clips in its step); the unclipped norm is
    ``scaler.last_step["grad_norm"]``. Lightning's own clipping then clips nothing. A module that
    overrides ``configure_gradient_clipping`` decides itself: Lightning clips then, as without ampkit.

    :param device: the autocast and scaler device ("cuda", "cpu").
    :param strict_loading: a resumed training checkpoint without the scaler's state (no
        ``"AmpkitPrecision"`` entry, nor Lightning's ``"MixedPrecision"``) raises RuntimeError;
        False (default): one warning names it and the scale restarts.
    :param gradscaler_kwargs: :class:`ampkit.GradScaler`'s keyword arguments (``init_scale``,
        ``scaler``, ``clipper``, ``nan_policy``, ``opt``, ...). With ``clipper=`` (or a
        ``clipper.*`` option) the clipper is yours and ``gradient_clip_val`` is refused.
    :raises ValueError: bad scaler arguments (as :class:`ampkit.GradScaler`); a device torch
        does not know ("gpu").
    """

    def __init__(self, device: str = "cuda", *, strict_loading: bool = False, **gradscaler_kwargs: Any) -> None:
        check_types(_PRECISION, {"strict_loading": strict_loading}, {"strict_loading": (bool,)})
        self.strict_loading = strict_loading
        scaler, self._clipping = make_scaler(device, gradscaler_kwargs, _PRECISION)
        self._hook_clips = False  # the module's configure_gradient_clipping clips (optimizer_step)
        super().__init__("16-mixed", device, scaler=scaler)
        if device == "cpu" and scaler.is_enabled():
            warn_fp16_on_cpu("ampkit.lightning.AmpkitPrecision", _LIGHTNING_ON_CPU)

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        """A checkpoint of a run with Lightning's own ``MixedPrecision`` holds torch's scaler
        state under its name: the scale and counters go on from it (under ``"AmpkitPrecision"``,
        Lightning loads ours after this). A training checkpoint with neither: one warning naming the
        missing entry (RuntimeError with ``strict_loading``)."""
        super().on_load_checkpoint(checkpoint)
        key = type(self).__qualname__
        stock = checkpoint.get(MixedPrecision.__qualname__)
        if key not in checkpoint and stock:
            self.load_state_dict(stock)
        elif (
            self.scaler is not None
            and key not in checkpoint
            and _OLD_KEY not in checkpoint
            and "optimizer_states" in checkpoint
        ):
            # A training checkpoint (it holds the optimizers) without the scaler's state.
            say_state_missing(_PRECISION, f"the checkpoint holds no '{key}' entry", self.scaler, self.strict_loading)

    def optimizer_step(  # type: ignore[override]
        self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        """Lightning's AMP step, with the Trainer's ``gradient_clip_val`` handed to ampkit's
        clipper before the unscale."""
        trainer = getattr(model, "_trainer", None)
        # A configure_gradient_clipping of the module's own decides per step whether to clip, after
        # the unscale: Lightning's clipping (on the unscaled gradients) runs then, not ampkit's.
        self._hook_clips = type(model).configure_gradient_clipping is not LightningModule.configure_gradient_clipping
        if trainer is not None and self._clipping.active and not self._hook_clips:
            value = trainer.gradient_clip_val or 0.0
            algorithm = GradClipAlgorithmType(trainer.gradient_clip_algorithm or GradClipAlgorithmType.NORM)
            if algorithm is not GradClipAlgorithmType.NORM and value:
                raise ValueError(
                    "Trainer(gradient_clip_algorithm='value') with AmpkitPrecision: ampkit clips inside "
                    "the scaler's unscale_, so the Trainer must not clip too; use "
                    "AmpkitPrecision(clipper='value', opt={'clipper.clip_value': v}) and leave "
                    "gradient_clip_val unset"
                )
            self._clipping.configure(float(value), 2.0, f"Trainer(gradient_clip_val={value})")
        return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)

    def clip_gradients(
        self,
        optimizer: Optimizer,
        clip_val: Union[int, float] = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        """Nothing to do: ampkit's clipper clipped inside ``unscale_``. A value other than the
        Trainer's (``configure_gradient_clipping``) is refused: this step was clipped already."""
        if not self._clipping.active or self._hook_clips:
            return super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)
        if not clip_val or clip_val <= 0:
            return None
        if GradClipAlgorithmType(gradient_clip_algorithm) is not GradClipAlgorithmType.NORM:
            raise ValueError(
                "AmpkitPrecision: clipping by value is ampkit's 'value' clipper: "
                "AmpkitPrecision(clipper='value', opt={'clipper.clip_value': v})"
            )
        if not self._clipping.follows_trainer:  # refused there, with the reason
            self._clipping.configure(float(clip_val), 2.0, f"clip_gradients(clip_val={clip_val})")
        if float(clip_val) != self._clipping.max_norm:
            raise ValueError(
                f"clip_gradients(clip_val={clip_val}) differs from the threshold this step was "
                f"clipped at ({_threshold(self._clipping.max_norm)}): ampkit clips inside unscale_, so a "
                "threshold given here is not supported with AmpkitPrecision: set Trainer(gradient_clip_val=...) "
                "in automatic optimization, or name the clipper in manual optimization "
                "(AmpkitPrecision(clipper='norm', opt={'clipper.max_norm': v}))"
            )
        return None


class AmpkitCheckpointIO(CheckpointIO):
    """Fabric's checkpoint IO (``TorchCheckpointIO`` or the one given) that also saves the
    :class:`AmpkitFabricPrecision`'s state under ``"AmpkitFabricPrecision"`` and restores it on
    load: Fabric's ``save``/``load`` never ask the precision plugin for its state.

    :param precision: the plugin whose state travels with the checkpoints.
    :param inner: the checkpoint IO that writes and reads the files.
    """

    KEY = "AmpkitFabricPrecision"

    def __init__(self, precision: "AmpkitFabricPrecision", inner: Optional[CheckpointIO] = None) -> None:
        self.precision = precision
        self.inner = inner if inner is not None else TorchCheckpointIO()

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        """Writes ``checkpoint`` with the precision plugin's state added."""
        state = self.precision.state_dict()
        full = dict(checkpoint, **{self.KEY: state}) if state else checkpoint
        self.inner.save_checkpoint(full, path, storage_options=storage_options)

    def load_checkpoint(
        self, path: Any, map_location: Optional[Any] = None, weights_only: Optional[bool] = None
    ) -> Dict[str, Any]:
        """Reads the checkpoint, restores the precision plugin's state from it and returns the
        rest. Without that state: one warning naming the missing entry (RuntimeError with the
        precision plugin's ``strict_loading``)."""
        checkpoint = self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        state = checkpoint.pop(self.KEY, None)
        if state:
            self.precision.load_state_dict(state)
        elif self.precision.scaler is not None:
            say_state_missing(
                "fabric.load",
                f"{path} holds no '{self.KEY}' entry",
                self.precision.scaler,
                getattr(self.precision, "strict_loading", False),
            )
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


class AmpkitFabricPrecision(FabricMixedPrecision):
    """``lightning.Fabric``'s ``16-mixed`` precision with :class:`ampkit.GradScaler` as its scaler.
    Use :func:`fabric_plugins`, which pairs it with the :class:`AmpkitCheckpointIO` that puts its
    state into ``fabric.save`` and takes it back in ``fabric.load``.

    :param device: the autocast and scaler device.
    :param strict_loading: ``fabric.load`` of a checkpoint without this plugin's state raises
        RuntimeError; False (default): one warning names it and the scale restarts.
    :param gradscaler_kwargs: :class:`ampkit.GradScaler`'s keyword arguments; clip with
        ``clipper=`` (``fabric.clip_gradients`` is refused).
    """

    def __init__(self, device: str = "cuda", *, strict_loading: bool = False, **gradscaler_kwargs: Any) -> None:
        who = "ampkit.lightning.AmpkitFabricPrecision"
        check_types(who, {"strict_loading": strict_loading}, {"strict_loading": (bool,)})
        check_arguments(dict(gradscaler_kwargs, device=device), who)
        self.strict_loading = strict_loading
        scaler = GradScaler(device, **gradscaler_kwargs)
        super().__init__("16-mixed", device, scaler=scaler)
        if device == "cpu" and scaler.is_enabled():
            warn_fp16_on_cpu("ampkit.lightning.AmpkitFabricPrecision", _LIGHTNING_ON_CPU)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Called by ``fabric.clip_gradients`` only, which is refused: the precision plugin
        never sees Fabric's threshold, so it cannot be handed to ampkit's clipper."""
        if self.scaler is None or not self.scaler.is_enabled():
            return super().unscale_gradients(optimizer)
        raise RuntimeError(
            "fabric.clip_gradients with AmpkitFabricPrecision: Fabric would clip with "
            "torch.nn.utils.clip_grad_norm_ on top of ampkit; clip with ampkit's clipper instead, "
            "fabric_plugins(..., clipper='norm', opt={'clipper.max_norm': v}), and read the unclipped "
            "norm from fabric.strategy.precision.scaler.last_step['grad_norm']"
        )


def fabric_plugins(
    device: str = "cuda",
    checkpoint_io: Optional[CheckpointIO] = None,
    *,
    strict_loading: bool = False,
    **gradscaler_kwargs: Any,
) -> List[Any]:
    """``Fabric(plugins=...)``'s list: an :class:`AmpkitFabricPrecision` and the
    :class:`AmpkitCheckpointIO` (around ``checkpoint_io``, default ``TorchCheckpointIO``) that
    saves and restores its state with ``fabric.save``/``fabric.load``.

    :param device: the autocast and scaler device.
    :param checkpoint_io: the checkpoint IO to wrap.
    :param strict_loading: ``fabric.load`` of a checkpoint without the scaler's state raises
        (:class:`AmpkitFabricPrecision`); default: one warning.
    :param gradscaler_kwargs: :class:`ampkit.GradScaler`'s keyword arguments.
    """
    precision = AmpkitFabricPrecision(device, strict_loading=strict_loading, **gradscaler_kwargs)
    return [precision, AmpkitCheckpointIO(precision, checkpoint_io)]
