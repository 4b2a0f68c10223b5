"""Count the words of a text."""


def count_words(text):
    return len(text.split(" "))
