"""Objects the Python API hands to the ranks: a model instance, an in-memory dataset, a loss.

``polytrain.train(model=MyNet(), dataset=(x, y), loss=my_loss)`` works as the string forms do:

- a function or class (model factory, dataset factory, loss) is sent by name (``module:name``;
  one defined in the calling script is imported from the script's file), as a launcher must;
- an ``nn.Module`` instance or an in-memory dataset (a ``torch.utils.data.Dataset``, tensors
  ``(x, y)`` / ``(x_train, y_train, x_test, y_test)``, or a dict of those, as
  :mod:`polytrain.data.user` reads them) is pickled once into a private file beside the run
  (mode 0600 in a 0700 folder), and every rank loads that file: the same weights and samples on
  every rank. Something that cannot be pickled (a lambda inside, an open file) is refused before
  any process starts, naming what could not be sent.

The files are written by this process and read only by the ranks it launches; they are not
checkpoints, which are never unpickled beyond tensors.
"""

from __future__ import annotations

import os
import pickle
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polytrain.errors import ConfigError

if TYPE_CHECKING:
    import torch

LOADER = {"model": "polytrain.memory:load_model", "dataset": "polytrain.memory:load_dataset"}


def _script_module() -> str | None:
    """The calling script's module name (its file's stem), importable from its folder.

    A factory defined in the script (``__main__``) is imported by the ranks as this module, as
    multiprocessing's spawn and accelerate's launchers do: the script's top level runs again on
    import, so its training call must sit under ``if __name__ == "__main__":``.
    """


    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or Path(path).suffix != ".py" or not Path(path).stem.isidentifier():
        return None
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return Path(path).stem


def reference(obj: Any, what: str) -> str:
    """A module-level function or class as 'module:name', the way every rank imports it."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if module == "__main__":
        module = _script_module()
    if not module or "<" in name:
        raise ConfigError(
            f"The {what} {obj!r} must be a module-level function or class (not a lambda or a "
            "nested function) of a module or of the script you run, because every rank imports "
            f"it by name. Define it at the top level, or pass {what}='my_pkg.mod:name'.")
    return f"{module}:{name}"


def send(obj: Any, what: str, folder: Path) -> str:
    """Pickle ``obj`` into a private file under ``folder``; its path."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    path = folder / f"{what}-{uuid.uuid4().hex[:12]}.pt"
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise ConfigError(
            f"The {what} given as a {type(obj).__name__} cannot be sent to the ranks: pickling it "
            f"failed ({type(exc).__name__}: {exc}). Make it picklable (no lambdas, open files or "
            f"locks inside), or give a factory: {what}='my_pkg.mod:make'.") from exc
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return str(path)


def _read(path: str) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)  # written by the launching process for its own ranks (see above)


def load_model(path: str) -> torch.nn.Module:
    """The model instance the API was given (every rank: the same weights)."""
    import torch

    obj = _read(path)
    if not isinstance(obj, torch.nn.Module):
        raise ConfigError(f"{path} holds a {type(obj).__name__}, not an nn.Module.")
    return obj


def load_dataset(path: str) -> Any:
    """The in-memory dataset the API was given, in any form :mod:`polytrain.data.user` reads."""
    return _read(path)


def _is_data(obj: Any) -> bool:
    import torch

    if isinstance(obj, torch.utils.data.Dataset | torch.Tensor):
        return True
    if isinstance(obj, (tuple, list)):
        return bool(obj) and all(_is_data(o) for o in obj)
    return isinstance(obj, dict)


def resolve(kw: dict[str, Any]) -> None:
    """Turn the API's objects in ``kw`` (model, dataset, loss) into what a JobConfig holds
    (names stay names, and torch is imported only when an object is given)."""
    if all(isinstance(kw.get(k), (str, type(None))) for k in ("model", "dataset", "loss")):
        return
    import torch

    folder = Path(kw.get("out") or "runs") / ".objects"
    model = kw.get("model")
    if isinstance(model, torch.nn.Module):
        kw["model"] = LOADER["model"]
        kw["model_options"] = {**(kw.get("model_options") or {}), "path": send(model, "model", folder)}
    elif model is not None and not isinstance(model, str):
        kw["model"] = reference(model, "model factory")
    data = kw.get("dataset")
    if data is not None and not isinstance(data, str):
        if _is_data(data):
            kw["dataset"] = LOADER["dataset"]
            kw["data_options"] = {**(kw.get("data_options") or {}),
                                  "path": send(data, "dataset", folder)}
        else:
            kw["dataset"] = reference(data, "dataset factory")
    loss = kw.get("loss")
    if loss is not None and not isinstance(loss, str):
        kw["loss"] = reference(loss, "loss function")
