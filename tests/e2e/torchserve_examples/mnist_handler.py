"""Stand-in for TorchServe's MNIST example handler: ImageClassifier with grey preprocessing."""

from torchvision import transforms
from ts.torch_handler.image_classifier import ImageClassifier


class MNISTDigitClassifier(ImageClassifier):
    image_processing = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
    )

    def postprocess(self, data):
        return data.argmax(1).tolist()
