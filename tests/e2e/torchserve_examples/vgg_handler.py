"""Stand-in for TorchServe's VGG16 example: it loads the model itself and never calls eval()."""

import importlib
import os

import torch
from ts.torch_handler.image_classifier import ImageClassifier
from ts.utils.util import list_classes_from_module


class VGGImageClassifier(ImageClassifier):
    def _load_pickled_model(self, model_dir, model_file, model_pt_path):
        if not os.path.isfile(os.path.join(model_dir, model_file)):
            raise RuntimeError("Missing the model.py file")
        module = importlib.import_module(model_file.split(".")[0])
        classes = list_classes_from_module(module)
        if len(classes) != 1:
            raise ValueError(f"Expected only one class as model definition. {classes}")
        model = classes[0]()
        model.load_state_dict(torch.load(model_pt_path))
        return model
