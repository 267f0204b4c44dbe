// kiln example: an MLP trained with AdamW on the UCI handwritten digits (see
// train_digits.hpp). Usage: train_digits [epochs]
#include <cstdlib>

#include "train_digits.hpp"

int main(int argc, char** argv) {
  int epochs = argc > 1 ? std::atoi(argv[1]) : 12;
  double acc = kiln_examples::train_digits(epochs);
  return acc >= 0.95 ? 0 : 1;
}
