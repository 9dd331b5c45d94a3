"""A reward function for the dataset-task tests, named by import path as a user's would be."""


def prefix_match(prompt: str, response: str, answer: str) -> float:
    """The fraction of the answer's characters the response starts with."""
    same = 0
    for got, want in zip(response, answer):
        if got != want:
            break
        same += 1
    return same / len(answer)
