"""Dog breeds, a fan-in node: the image from pre_processing, the verdict from cat_dog."""

from ts.torch_handler.image_classifier import ImageClassifier


class DogBreedClassifier(ImageClassifier):
    def preprocess(self, data):
        self.is_dog = []
        images = []
        for row in data:
            dog = row.get("cat_dog_classification").decode() == "dog"
            self.is_dog.append(dog)
            if dog:
                images.append({"body": row.get("pre_processing").decode()})
        return ImageClassifier.preprocess(self, images) if images else None

    def inference(self, data, *args, **kwargs):
        return None if data is None else ImageClassifier.inference(self, data, *args, **kwargs)

    def postprocess(self, data):
        answers = ["It's a cat!"] * len(self.is_dog)
        if data is None:
            return answers
        breeds = iter(ImageClassifier.postprocess(self, data))
        return [next(breeds) if dog else answers[i] for i, dog in enumerate(self.is_dog)]
