import unittest

from wordcount import count_words


class CountWords(unittest.TestCase):
    def test_words_apart(self):
        self.assertEqual(count_words("two words"), 2)

    def test_runs_of_spaces(self):
        self.assertEqual(count_words("two  words"), 2)
