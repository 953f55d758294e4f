pub mod atomic_writer;
