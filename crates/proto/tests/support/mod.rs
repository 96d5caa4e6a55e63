pub mod vectors_gen;
